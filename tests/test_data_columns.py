"""The Ray Data job's resume key (presto_ray/data_columns.py): a pure function of a row's id and
prompt fields, so the stage that writes it and the filter that reads it agree."""

from presto_ray.data_columns import InputColumnsConfig, input_key, key_id

NAMES = InputColumnsConfig()


def test_the_key_changes_with_the_prompt_and_keeps_the_id():
    row = {"id": "q#1", "prompt": "what follows?", "topic": "ignored"}
    key = input_key(row, NAMES)
    assert key_id(key) == "q#1"  # an id holding '#' comes back whole
    assert input_key({**row, "topic": "other"}, NAMES) == key  # pass-through columns do not count
    assert input_key({**row, "prompt": "what follows?!"}, NAMES) != key
    chat = {"id": "q#1", "messages": [{"role": "user", "content": "what follows?"}]}
    assert input_key(chat, NAMES) != key


def test_a_bad_prompt_still_has_a_key():
    # a lone surrogate is a bad row (it gets an error row): keying it must not raise
    assert key_id(input_key({"id": "s", "prompt": "x\ud800"}, NAMES)) == "s"
    assert input_key({"id": "s", "prompt": "x\ud800"}, NAMES) != input_key({"id": "s", "prompt": "x\ud801"}, NAMES)
