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
    # A byte-level vocabulary spells the lone byte 0xE9 'é', and the text 'é' is another token: not guessed
    with pytest.raises(LongswiftError, match=r"'é' names two tokens of this model: the vocabulary entry 180 and the "
                                             r"text's token 2756"):
        embedded.token_id("é")


@pytest.mark.slow
def test_the_command_line_bans_what_the_library_bans(embedded, tmp_path, capsys):
    """Greedy, so each run's first token is the argmax of what its bans leave: banning the unbanned run's first
    token (--ban-ids), then that run's first (--ban-token, by its vocabulary entry), then that one's (a second
    --ban-ids list) makes each ban change the output. The command line must give the library's tokens for all three
    banned, and none of them: dropping any one of the flags' bans would leave its token first."""
    new = 12
    generation = GenerationConfig(max_new_tokens=new, ignore_eos=True)
    banned: tuple[int, ...] = ()
    for _ in range(3):
        run = embedded.generate(PROMPT, chat=True, sampling=SamplingConfig(temperature=0, banned_ids=banned),
                                generation=generation)
        assert run.token_ids[0] not in banned
        banned += (run.token_ids[0],)
    expected = embedded.generate(PROMPT, chat=True, sampling=SamplingConfig(temperature=0, banned_ids=banned),
                                 generation=generation)
    assert not set(banned) & set(expected.token_ids)
    entry = embedded.tokenizer.convert_ids_to_tokens(banned[1])
    out = tmp_path / "o.json"
    code, _, err = run_cli(capsys, "generate", "--prompt", PROMPT, "--greedy", "--max-new-tokens", str(new),
                           "--ignore-eos", "--no-progress", "--ban-ids", str(banned[0]), "--ban-token", entry,
                           "--ban-ids", str(banned[2]), "--json", str(out))
    assert code == 0, err
    assert json.loads(out.read_text())["token_ids"] == expected.token_ids


@pytest.mark.parametrize("args,match", [
    (["--ban-ids", "1,x"], "--ban-ids must be token ids separated by commas or spaces; got '1,x'"),
    (["--ban-ids", " , "], "--ban-ids needs at least one token id"),
    (["--ban-ids=-3"], "--ban-ids must be non-negative token ids; got -3"),
    (["--ban-ids", "49152", "--ban-ids", "5"], "--ban-ids must be in [0, 49152) for this model"),  # each list counts
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


def test_ban_token_on_a_model_without_a_tokenizer_names_ban_ids(capsys, tmp_path):
    from conftest import tiny_hf_model

    tiny_hf_model("llama", seed=9, vocab=64).save_pretrained(tmp_path / "m")
    capsys.readouterr()
    code, _, err = run_cli(capsys, "generate", "--model", str(tmp_path / "m"), "--prompt-ids", "3,4,5", "--heads",
                           "none", "--max-new-tokens", "2", "--no-progress", "--ban-token", "x")
    assert_one_line_error(code, err, "--ban-token names tokens by their text, and this model has no tokenizer: ban "
                                     "them by id with --ban-ids")
