"""Banned tokens from the command line (--ban-ids, --ban-token) and by name (Engine.token_id): the run bans
exactly what SamplingConfig.banned_ids bans in the library, and a bad value is refused in one line."""

from __future__ import annotations

import json

import pytest
from conftest import assert_one_line_error, run_cli

from longswift import GenerationConfig, SamplingConfig
from longswift.errors import LongswiftError

PROMPT = "Say hello and then describe the sea."


def test_token_id_takes_vocabulary_entries_and_one_token_texts(embedded):
    vocab = embedded.tokenizer.get_vocab()
    assert embedded.token_id("<|im_start|>") == vocab["<|im_start|>"]
    assert embedded.token_id("Ġthe") == vocab["Ġthe"]  # spelt as the vocabulary spells it
    assert embedded.token_id(" the") == vocab["Ġthe"]  # ... or as the text it stands for
    with pytest.raises(LongswiftError, match=r"'the_sea_is' is not one token of this model: it encodes as 5 tokens"):
        embedded.token_id("the_sea_is")
    with pytest.raises(LongswiftError, match="an empty token text names no token"):
        embedded.token_id("")


@pytest.mark.slow
def test_the_command_line_bans_what_the_library_bans(embedded, tmp_path, capsys):
    """Greedy, so the first token the unbanned run writes is the model's argmax: banning it (by id) and the chat
    start token (by name) must change the text, never emit either, and give the library's tokens for those ids
    (with two more ids from a second --ban-ids: each list adds to the others)."""
    new = 12
    sampling = SamplingConfig(temperature=0)
    plain = embedded.generate(PROMPT, chat=True, sampling=sampling, generation=GenerationConfig(max_new_tokens=new,
                                                                                                 ignore_eos=True))
    first, start = plain.token_ids[0], embedded.token_id("<|im_start|>")
    banned = embedded.generate(PROMPT, chat=True, sampling=SamplingConfig(temperature=0, banned_ids=(first, start, 3, 4)),
                               generation=GenerationConfig(max_new_tokens=new, ignore_eos=True))
    assert banned.token_ids != plain.token_ids and not {first, start} & set(banned.token_ids)
    out = tmp_path / "o.json"
    code, _, err = run_cli(capsys, "generate", "--prompt", PROMPT, "--greedy", "--max-new-tokens", str(new),
                           "--ignore-eos", "--no-progress", "--ban-ids", str(first), "--ban-token", "<|im_start|>",
                           "--ban-ids", "3, 4",
                           "--json", str(out))
    assert code == 0, err
    assert json.loads(out.read_text())["token_ids"] == banned.token_ids


@pytest.mark.parametrize("args,match", [
    (["--ban-ids", "1,x"], "--ban-ids must be token ids separated by commas or spaces; got '1,x'"),
    (["--ban-ids", " , "], "--ban-ids needs at least one token id"),
    (["--ban-ids=-3"], "--ban-ids must be non-negative token ids; got -3"),
    (["--ban-ids", "5", "--ban-ids", "49152"], "--ban-ids must be in [0, 49152) for this model"),  # each list counts
    (["--ban-ids", "5,49152"], "--ban-ids must be in [0, 49152) for this model"),  # refused before loading
    (["--ban-token", ""], "--ban-token needs a token's text"),
])
def test_bad_bans_are_refused_before_loading(capsys, no_loading, args, match):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", *args)
    assert_one_line_error(code, err, match)


@pytest.mark.slow
def test_a_ban_token_that_is_not_one_token_is_a_one_line_error(capsys):
    code, _, err = run_cli(capsys, "generate", "--prompt", "hi", "--max-new-tokens", "2", "--ban-token", "the_sea_is")
    assert_one_line_error(code, err, "--ban-token: 'the_sea_is' is not one token of this model: it encodes as 5 tokens")


def test_bans_are_the_checkpoints_on_resume(capsys, tmp_path):
    """A resumed run bans what its first run banned (the checkpoint records banned_ids): --ban-ids again is refused."""
    code, _, err = run_cli(capsys, "generate", "--resume", str(tmp_path / "c.ckpt"), "--ban-ids", "3")
    assert_one_line_error(code, err, "--ban-ids cannot be used with --resume: the checkpoint's settings are used")
