"""`longswift bench-steps`: built-in shapes, the floor and projection arithmetic against hand
computations, random tries, a tiny shape end to end (JSON and markdown), and one-line refusals."""

from __future__ import annotations

import json
import platform

import pytest
import torch
from conftest import assert_one_line_error, run_cli

from longswift.bench.projection import StepCosts, floor_seconds, integrate, project, tokens_per_step
from longswift.bench.shapes import SHAPES, random_state, shape_config, weight_bytes_read
from longswift.bench.steps import StepBenchConfig, plan_steps, random_trie
from longswift.cli import main
from longswift.config import SpecConfig
from longswift.errors import LongswiftError
from longswift.runtime.linear import packing_supported
from longswift.runtime.model import Transformer

TINY = {"model_type": "qwen2", "vocab_size": 128, "hidden_size": 64, "intermediate_size": 96, "num_hidden_layers": 2,
        "num_attention_heads": 4, "num_key_value_heads": 2, "max_position_embeddings": 256, "rms_norm_eps": 1e-6,
        "rope_theta": 10000.0, "tie_word_embeddings": False}
# A run small enough for seconds: draft budget 128 (sinks 4 + window 32 + 92 retrieved).
TINY_RUN = ("--shape", "tiny", "--tree-nodes", "1,4", "--reps", "2", "--warmup", "1", "--draft-kv-budget", "128",
            "--draft-window", "32", "--attention-sinks", "4", "--bandwidth-mib", "8", "--device", "cpu", "--threads", "1")


CPU = torch.device("cpu")


@pytest.fixture
def tiny(monkeypatch):
    monkeypatch.setitem(SHAPES, "tiny", TINY)


def test_shapes_have_the_published_sizes():
    llama, qwen, smol = (shape_config(name) for name in ("llama-3.1-8b", "qwen2.5-7b", "smollm2-135m"))
    assert llama.parameter_count() == 8_030_261_248 and llama.rope_type == "llama3" and llama.context_limit == 131072
    assert (llama.num_heads, llama.num_kv_heads, llama.head_dim, llama.num_layers) == (32, 8, 128, 32)
    # Qwen2.5-7B: 7.62B, its q/k/v biases counted (they were left out: 129,024 values fewer than published)
    assert qwen.parameter_count() == 7_615_616_512 and qwen.qkv_bias and qwen.sliding_window is None
    assert (qwen.num_heads, qwen.num_kv_heads, qwen.num_layers, qwen.vocab_size) == (28, 4, 28, 152064)
    assert smol.parameter_count() == 134_515_008 and smol.tie_word_embeddings  # the embedded model's count
    assert shape_config("llama-3.1-8b", layers=2).num_layers == 2
    with pytest.raises(LongswiftError, match="unknown shape 'llama-9b'"):
        shape_config("llama-9b")


@pytest.mark.parametrize("variant", [{}, {"tie_word_embeddings": True},
                                     {"model_type": "llama", "attention_bias": True, "mlp_bias": True},
                                     {"model_type": "qwen3", "head_dim": 32, "attention_bias": True}])
def test_the_state_shapes_and_parameter_count_are_transformers_own(variant):
    """The tensors a checkpoint must hold, and what the memory plan, info and bench-steps' bytes read count, are
    the parameters transformers builds for the config: biases and q/k norms included (the count left the biases
    out while it was a second copy of the layout), a tied head counted once."""
    from transformers import AutoModelForCausalLM

    cfg = shape_config(TINY | variant)
    reference = AutoModelForCausalLM.from_config(cfg.hf_config)
    assert cfg.state_shapes() == {name: tuple(p.shape) for name, p in reference.named_parameters()}
    assert cfg.parameter_count() == sum(p.numel() for p in reference.parameters())
    assert cfg.qkv_bias == ("attention_bias" in variant or variant.get("model_type") is None)


def test_random_state_has_every_tensor_and_shares_the_untied_head():
    cfg = shape_config(TINY)
    state = random_state(cfg, torch.bfloat16, torch.device("cpu"), seed=1)
    assert set(state) == set(cfg.state_shapes())
    assert all(t.dtype == torch.bfloat16 and tuple(t.shape) == cfg.state_shapes()[k] for k, t in state.items())
    assert state["lm_head.weight"] is state["model.embed_tokens.weight"]
    assert torch.equal(random_state(cfg, torch.bfloat16, torch.device("cpu"), seed=1)["model.norm.weight"],
                       torch.ones(64, dtype=torch.bfloat16))
    Transformer(cfg, state)  # the model accepts it
    # an untied table is only gathered: the bytes read are those of every weight but the embedding
    elem = 4
    assert weight_bytes_read(cfg, torch.float32) == (cfg.parameter_count() - 128 * 64) * elem
    tied = shape_config(TINY | {"tie_word_embeddings": True})
    assert weight_bytes_read(tied, torch.float32) == tied.parameter_count() * elem


@pytest.mark.parametrize("tie", [False, True], ids=["untied", "tied"])
def test_the_step_plan_counts_what_a_packed_random_model_holds(tiny, tie):
    """The random state's untied head is the embedding itself, so its packed copy frees nothing and
    is an extra table, as a tied head's is: the plan's weights and copies are the bytes the model keeps."""
    if not packing_supported(torch.float32, CPU):
        pytest.skip("this torch build has no oneDNN packing for float32")
    cfg = shape_config(TINY | {"model_type": "llama", "tie_word_embeddings": tie})  # no q/k/v biases,
    # which the parameter count leaves out
    model = Transformer(cfg, random_state(cfg, torch.float32, CPU, seed=2), pack=True)
    storages = {t.untyped_storage().data_ptr(): t.untyped_storage().nbytes() for t in model.state.values()}
    held = sum(storages.values()) + sum(p.weight.numel() * p.weight.element_size() for p in model.packed_copies)
    bench = StepBenchConfig(shape="tiny", contexts=(64,), tree_nodes=(1, 4)).for_device(CPU)
    gamma = 3
    plan = plan_steps(cfg, bench, torch.float32, CPU, True, gamma)
    heads = gamma * cfg.hidden_size * (cfg.hidden_size + 2) * 4
    assert held == plan.weights - heads + plan.packed_weights
    assert plan.packed_weights == cfg.vocab_size * cfg.hidden_size * 4  # one extra table, tied or not
    unpacked = plan_steps(cfg, bench, torch.float32, CPU, False, gamma)
    assert unpacked.packed_weights == 0 and unpacked.weights == plan.weights


def test_floor_and_tokens_per_step_by_hand():
    assert floor_seconds(6_000, 4_000, 1e6) == pytest.approx(0.01)  # 10 KB at 1 MB/s
    assert tokens_per_step(0.5, 4) == 3.0 and tokens_per_step(0.0, 4) == 1.0 and tokens_per_step(1.0, 3) == 4.0
    for bad in (-0.1, 1.5):
        with pytest.raises(LongswiftError, match="--alpha must be in"):
            tokens_per_step(bad, 4)


def test_integrate_is_exact_for_piecewise_linear_costs():
    xs, ys = (0, 10, 20), (1.0, 3.0, 3.0)
    assert integrate(xs, ys, 0, 20) == pytest.approx(10 * 2 + 10 * 3)
    assert integrate(xs, ys, 5, 15) == pytest.approx(5 * 2.5 + 5 * 3)  # f(5) = 2, f(10) = 3
    assert integrate(xs, ys, 7, 7) == 0.0
    with pytest.raises(LongswiftError, match="does not extrapolate"):
        integrate(xs, ys, 0, 21)


def test_projection_matches_a_hand_computation():
    costs = StepCosts(contexts=(1000, 2000, 3000), ar=(0.010, 0.020, 0.030), draft=(0.005, 0.005, 0.005),
                      verify=(0.012, 0.022, 0.032), walk_row=(0.001, 0.001, 0.001), reselect=(None, 0.025, 0.035))
    p = project(costs, prefix=1000, new_tokens=2000, alpha=0.5, depth=4, draft_budget=2000, window=100)
    assert p.tokens_per_step == 3.0
    # AR: integral of c / 100000 s over [1000, 3000] = (3000^2 - 1000^2) / 2e5 = 40 s
    assert p.ar_seconds == pytest.approx(40.0)
    # TokenSwift: a step costs draft + verify + 3 rows = 0.02, 0.03, 0.04 s at the three contexts: integral 60,
    # per token / 3 = 20 s; refills past 2000: (reselect - draft) = 0.02 .. 0.03 s, integral 25, one per 100 tokens
    assert p.tokenswift_seconds == pytest.approx(20.0 + 0.25)
    assert p.speedup == pytest.approx(40.0 / 20.25)
    unrefilled = project(costs, prefix=1000, new_tokens=2000, alpha=0.5, depth=4, draft_budget=None, window=100)
    assert unrefilled.tokenswift_seconds == pytest.approx(20.0)  # no partial cache (fused mode): no refills
    below = project(costs, prefix=1000, new_tokens=1000, alpha=0.0, depth=4, draft_budget=5000, window=100)
    assert below.tokenswift_seconds == pytest.approx(1000 * (0.018 + 0.028) / 2)  # tau 1, no refills
    with pytest.raises(LongswiftError, match="does not extrapolate"):
        project(costs, prefix=500, new_tokens=1000, alpha=0.5, depth=4, draft_budget=2000, window=100)


def test_random_trie_has_the_asked_size_and_depth():
    gen = torch.Generator().manual_seed(0)
    for n in (1, 2, 8, 121):
        trie = random_trie(n, 4, root=7, gen=gen)
        assert len(trie) == n and max(trie.depths) <= 4 and trie.tokens[0] == 7
        assert trie.mask().shape == (n, n)
    assert max(random_trie(5, 4, 0, gen).depths) <= 4 and random_trie(5, 1, 0, gen).depths == [0, 1, 1, 1, 1]


def test_projection_ends_and_tree_are_measured_not_extrapolated():
    cfg = StepBenchConfig(shape="smollm2-135m", contexts=(2048, 8192), tree_nodes=(1, 4), alphas=(0.5,), prefix=1024,
                          new_tokens=6000).for_device(torch.device("cpu"))
    assert cfg.measured_contexts() == (1024, 2048, 4096, 7024, 8192)  # both ends and the draft budget inside
    assert cfg.projection_nodes == 7 and cfg.measured_nodes() == (1, 4, 7)  # CPU tree 1,1,1 + an n-gram's 3 tokens
    assert cfg.depth == 4
    paper = StepBenchConfig(shape="smollm2-135m", spec=SpecConfig(tree="1,3,3,3", ngram_topk=20)).for_device(
        torch.device("cpu"))
    assert paper.projection_nodes == 1 + 1 + 3 + 9 + 27 + 20 * 3 and paper.measured_contexts() == (2048, 4096, 8192)
    # a trie of 3 nodes holds at most 2 drafted positions: tau = 1 + 4 alpha projected steps it cannot make
    cut = StepBenchConfig(shape="smollm2-135m", spec=SpecConfig(tree="1,3,3", max_nodes=3)).for_device(
        torch.device("cpu"))
    assert cut.projection_nodes == 3 and cut.depth == 2
    default = StepBenchConfig(shape="smollm2-135m", alphas=(0.7,)).for_device(torch.device("cpu"))
    assert (default.prefix, default.new_tokens) == (4096, 4096)  # CPU: from the paper's prefix to the largest context


def test_tiny_shape_end_to_end(tiny, tmp_path, capsys):
    md, js = tmp_path / "steps.md", tmp_path / "steps.json"
    md.write_text("# earlier\n")
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64,256", "--alpha", "0.5,0.9",
                         "--prefix", "100", "--new-tokens", "150", "--out", str(md), "--json", str(js))
    assert code == 0, err
    assert "memory plan:" in err and "context 256:" in err
    data = json.loads(js.read_text())
    assert [c["context"] for c in data["contexts"]] == [64, 100, 128, 250, 256]  # asked + projection ends + budget
    assert data["identity"]["layers"] == 2 and data["identity"]["dtype"] == "float32"
    assert data["identity"]["command"].startswith("longswift bench-steps --shape tiny")
    assert data["versions"]["torch"] == torch.__version__ and "longswift" in data["versions"]
    assert data["processor"].startswith(platform.machine())  # (the CPU's model: the JSON had no machine)
    kv, weights, bw = data["kv_bytes_per_token"], data["weight_bytes_per_step"], data["bandwidth_bytes_per_s"]
    assert kv == 2 * 2 * 2 * 16 * 4
    for c in data["contexts"]:
        assert c["floor"] == pytest.approx((weights + c["context"] * kv) / bw)
        assert c["ar"] > 0 and c["draft"] > 0 and c["walk_row"] > 0 and c["walk_row_cached"] > 0
        assert set(c["verify"]) == set(c["logits_rows"]) == {"1", "4", "7"}
        assert (c["reselect"] is None) == (c["context"] < 128)
        assert c["draft_cache"] == (c["context"] if c["context"] < 128 else 128 - 32 + 16)
    proj = data["projection"]
    assert "not a measurement" in proj["label"] and proj["tree_nodes"] == 7 and proj["depth"] == 4
    assert [r["tokens_per_step"] for r in proj["runs"]] == [3.0, pytest.approx(4.6)]
    text = md.read_text()
    assert text.startswith("# earlier\n") and "## longswift bench-steps: tiny shape" in text
    assert "### Projection (computed from the costs above, not measured)" in text and "| 0.90 | 4.60 |" in text
    assert "| context | AR ms | AR eager ms | floor ms | floor / AR |" in out
    # no CUDA graphs on a CPU: the AR step is the eager one, and no separate eager figure is claimed
    assert all(c["ar_eager"] is None for c in data["contexts"]) and data["identity"]["cuda_graphs"] == "auto"
    # the CPU walks row by row: no batched-walk costs, and the projection counts walk rows
    assert data["settings"]["walk"] == "rows" and all(c["walk_batched"] == {} for c in data["contexts"])


def test_the_gpu_path_times_the_step_bodies_with_the_draw_inside(tiny, tmp_path, capsys, monkeypatch):
    """Where the loops run step bodies (CUDA; forced here, run eagerly), the AR step is timed as
    generation runs it, the draw inside the decode body (StepGraphs.sample_decode), beside the eager
    forward-and-draw; each replayed step draws into the device history at the root's position and
    leaves the cache at the context."""
    import longswift.spec.tokenswift as ts
    from longswift.runtime.cuda_graphs import StepGraphs

    monkeypatch.setattr(ts, "step_bodies", lambda model: True)
    drawn: list[int] = []
    real = StepGraphs.sample_decode

    def spy(self, logits, u, position):
        out = real(self, logits, u, position)
        drawn.append((position, self.cache.length))
        return out

    monkeypatch.setattr(StepGraphs, "sample_decode", spy)
    js = tmp_path / "steps.json"
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64", "--alpha", "0.5",
                             "--prefix", "32", "--new-tokens", "32", "--json", str(js))
    assert code == 0, err
    data = json.loads(js.read_text())
    assert all(c["ar"] > 0 and c["ar_eager"] > 0 for c in data["contexts"])
    assert drawn and {p for p, _ in drawn} == {c["context"] for c in data["contexts"]}
    assert all(length == p + 1 for p, length in drawn)  # the forward ran at the root's slot (truncated after)


def test_batched_walk_is_measured_and_projected(tiny, tmp_path, capsys):
    """--walk batched (the GPU default) on the CPU: every tree size gets its walk cost, the report a
    table of them, and the projection a step of draft + verify + one walk."""
    js = tmp_path / "steps.json"
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64", "--alpha", "0.5",
                             "--prefix", "32", "--new-tokens", "32", "--walk", "batched", "--json", str(js))
    assert code == 0, err
    data = json.loads(js.read_text())
    assert data["settings"]["walk"] == "batched"
    for c in data["contexts"]:
        assert set(c["walk_batched"]) == set(c["verify"]) and all(v > 0 for v in c["walk_batched"].values())
    assert "Batched walk" in out and "a step costs draft + verify + the batched walk" in out


@pytest.mark.parametrize("mode", ["fused", "full-draft-cache"])
def test_runs_without_a_partial_cache_are_measured_and_projected_without_refills(tiny, tmp_path, capsys, mode):
    """The fused draft mode (no draft forward: the heads on the state that predicted the root, its
    tree without --tree's first depth) and --draft-cache full draft without a partial cache: no
    refill is measured, none is projected, and the budget is no context of its own."""
    js = tmp_path / "steps.json"
    flags = ("--draft-mode", "fused", "--tree", "1,2,2") if mode == "fused" else ("--draft-cache", "full")
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, *flags, "--contexts", "64,256", "--alpha", "0.5",
                             "--prefix", "100", "--new-tokens", "150", "--json", str(js))
    assert code == 0, err
    data = json.loads(js.read_text())
    assert [c["context"] for c in data["contexts"]] == [64, 100, 250, 256]  # no 128: nothing refills there
    assert all(c["reselect"] is None and c["draft"] > 0 for c in data["contexts"])
    assert "no partial cache, so no refills" in out and data["projection"]["depth"] == 4  # an n-gram path's
    if mode == "fused":
        assert data["settings"]["draft_mode"] == "fused" and "(fused draft mode)" in out
        assert "Draft: the fused mode's, with no forward" in out
        assert data["projection"]["tree_nodes"] == 1 + 2 + 4 + 1 * 2 * 3  # tree 2,2 + an n-gram's 3 tokens per depth-1 token


@pytest.mark.parametrize("flags, prefix, new, wording", [
    ((), "100", "150", "past 128 cached entries one step per"),
    (("--draft-cache", "static"), "100", "150", "its static partial cache is selected once at the budget"),
    ((), "32", "32", "the run stays within the draft budget of 128 entries, so it drafts on the full cache"),
])
def test_the_projection_says_how_the_partial_cache_refills(tiny, capsys, flags, prefix, new, wording):
    """Measured contexts past the draft budget (256 here) time a refill whatever the projected run
    does; the projection's text follows the run: dynamic refills, a static selection, or none at all
    for a run that never outgrows the budget (it was called static before)."""
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, *flags, "--contexts", "64,256", "--alpha", "0.5",
                             "--prefix", prefix, "--new-tokens", new)
    assert code == 0, err
    assert wording in out
    phrases = ("past 128 cached entries", "its static partial cache", "stays within the draft budget",
               "no partial cache")
    assert sum(p in out for p in phrases) == 1, out  # one account of refills, the run's


def test_layers_override_is_reported(tiny, capsys, tmp_path):
    js = tmp_path / "s.json"
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "32", "--layers", "1", "--json", str(js))
    assert code == 0, err
    assert json.loads(js.read_text())["identity"]["layers"] == 1
    assert "1 of the shape's 2 layers (--layers)" in out and "Projection" not in out  # no --alpha: nothing projected


def test_the_report_names_the_rope_scaling_and_the_processor_that_ran_the_steps(tiny, capsys, tmp_path):
    """--rope-scaling was applied but said nowhere (it can keep CUDA graphs off), and the machine line named the host
    CPU as the processor on CUDA too (found by review): the identity keeps both, as bench's does."""
    from longswift.bench.machine import processor_name

    js = tmp_path / "s.json"
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "32", "--rope-scaling", "yarn:2",
                             "--json", str(js))
    assert code == 0, err
    identity = json.loads(js.read_text())["identity"]
    assert identity["rope_scaling"] == "yarn:2" and identity["processor"] == processor_name(torch.device("cpu"))
    assert ", rope scaling yarn:2" in out


@pytest.mark.parametrize("argv, match", [
    (("--contexts", "0,64"), "--contexts must be positive"),
    (("--contexts", "64,x"), "--contexts takes comma-separated whole numbers"),
    (("--contexts", "64,,128"), "--contexts has an empty item (a number left out?)"),  # was read as 64,128
    (("--contexts", "64", "--tree-nodes", "8,"), "--tree-nodes has an empty item"),
    (("--contexts", "1000000000"), "not enough memory for these step costs"),
    (("--contexts", "64", "--alpha", "1.5"), "--alpha must be in [0, 1]"),
    (("--contexts", "64", "--layers", "0"), "--layers must be positive"),
    (("--contexts", "64", "--layers", "3"), "--layers 3 is deeper than the shape's 2 layers: give at most 2"),
    (("--contexts", "64", "--tree-nodes", "0"), "--tree-nodes must be positive"),
    (("--contexts", "64", "--alpha", "0.5", "--prefix", "64"), "--prefix 64 is not below the largest context"),
    (("--contexts", "64", "--alpha", "0.5"),
     "--prefix 4096 (the default: the paper's prompt) is not below the largest context 64, where a CPU projection "
     "ends: give a smaller --prefix"),
    (("--contexts", "64", "--reps", "-1"), "--reps must be positive, got -1"),  # (each flag and value named)
    (("--contexts", "64", "--warmup", "-1"), "--warmup must be >= 0, got -1"),
    (("--contexts", "64", "--new-tokens", "0"), "--new-tokens must be positive, got 0"),
    # a generation loop's settings, which one step's cost does not read (they were taken, and changed nothing)
    (("--contexts", "64", "--no-adaptive"), "unrecognized arguments: --no-adaptive"),
    (("--contexts", "64", "--read-every", "4"), "unrecognized arguments: --read-every 4"),
])
def test_bad_inputs_are_one_line_errors(tiny, capsys, argv, match):
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, *argv)
    assert_one_line_error(code, err, match)


STEPS, GENERATE = ["bench-steps", "--shape", "smollm2-135m"], ["generate", "--prompt", "hi"]
OUTPUT_FILES = [(STEPS, "--out"), (STEPS, "--json"), (["bench"], "--out"), (["bench"], "--json"),
                (["eval-heads", "--heads", "random"], "--json"), (GENERATE, "--output"), (GENERATE, "--json"),
                (GENERATE, "--checkpoint")]


@pytest.mark.parametrize("command,flag", OUTPUT_FILES, ids=[f"{c[0]}{f}" for c, f in OUTPUT_FILES])
def test_an_output_file_that_is_empty_or_names_a_directory_is_refused(capsys, no_loading, tmp_path, command, flag):
    """`--out d/sub/` wrote a file named `sub` (Path drops the slash); `--json ""` was refused as "output path
    '.' is a directory", a path nobody typed."""
    for value, said in (("", "is empty: give a file name"),
                        (f"{tmp_path}/sub/", "ends in '/', so it names a directory: give a file name")):
        assert main([*command, flag, value]) == 2
        err = capsys.readouterr().err
        assert f"argument {flag}: " in err and said in err and err.count("\n") == 1, err
    assert list(tmp_path.iterdir()) == []


def test_unknown_shape_is_an_argparse_error(capsys):
    assert main(["bench-steps", "--shape", "llama-9b"]) == 2
    err = capsys.readouterr().err
    assert "invalid choice: 'llama-9b'" in err and err.count("\n") == 1  # one line


def test_projection_counts_the_lm_head_once_per_step_for_small_tries():
    """Small tries in steps that emit several tokens get all LM-head rows in one pass, larger ones their
    spine's, so their walk rows only sample; other steps pay the LM head per visited row."""
    from longswift.bench.steps import ContextCosts, step_costs
    from longswift.spec.tokenswift import BATCH_FROM_TOKENS, BATCHED_LOGITS_NODES

    small, large = BATCHED_LOGITS_NODES, BATCHED_LOGITS_NODES + 1
    costs = [ContextCosts(context=c, ar=0.01, draft=0.01, draft_cache=c, reselect=None, walk_row=0.004,
                          walk_row_cached=0.0005, verify={small: 0.02, large: 0.03}, logits_rows={small: 0.006})
             for c in (100, 200)]
    many, one = BATCH_FROM_TOKENS, 1.0  # tokens per step
    assert step_costs(costs, small, many).walk_row == (0.0005, 0.0005)
    assert step_costs(costs, small, many).verify == pytest.approx((0.026, 0.026))  # forward + all rows' LM head
    assert step_costs(costs, small, one).walk_row == (0.004, 0.004)  # one-token steps: rows on demand
    assert step_costs(costs, small, one).verify == (0.02, 0.02)
    assert step_costs(costs, large, many).walk_row == (0.004, 0.004)  # no spine measured: rows on demand
    assert step_costs(costs, large, many).verify == (0.03, 0.03)
    for c in costs:
        c.logits_rows[5] = 0.003  # a spine of depth 4: the root and the heads' first candidates
    assert step_costs(costs, large, many, spine=5).walk_row == (0.0005, 0.0005)
    assert step_costs(costs, large, many, spine=5).verify == pytest.approx((0.033, 0.033))
    assert step_costs(costs, large, one, spine=5).walk_row == (0.004, 0.004)
    for c in costs:
        c.walk_batched = {small: 0.001, large: 0.002}
    # the batched walk: its verify pass computes every row's logits, and one walk draws them all
    assert step_costs(costs, large, one, "batched").verify == pytest.approx((0.032, 0.032))
    assert step_costs(costs, large, one, "batched").walk_row == (0.0, 0.0)


def test_a_bandwidth_buffer_past_free_memory_is_named(capsys):
    """It was refused as 'not enough memory for these step costs' with the model's 0.26 GiB plan and the
    advice to lower --contexts, --tree-nodes or --layers, none of which was the cause."""
    code, _, err = run_cli(capsys, "bench-steps", "--shape", "smollm2-135m", "--layers", "2", "--contexts", "64",
                           "--bandwidth-mib", str(2**40))
    assert_one_line_error(code, err, f"the read-bandwidth buffer of {2**40} MiB does not fit in the ")
    assert "give a smaller --bandwidth-mib" in err


def test_the_floor_counts_the_float32_copy_the_lm_head_reads_off_cuda(tiny, tmp_path, capsys):
    """--float32-logits on a bfloat16 model off CUDA runs the LM head on a float32 copy of its weight
    (runtime.linear.float32_head; the memory plan counts that copy): a step reads 4 bytes per head value,
    not 2, and the floor said the step read less than it does."""
    cfg = shape_config(TINY)
    head = cfg.vocab_size * cfg.hidden_size
    js = tmp_path / "steps.json"
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64", "--dtype", "bfloat16",
                           "--float32-logits", "--json", str(js))
    assert code == 0, err
    assert json.loads(js.read_text())["weight_bytes_per_step"] == (cfg.parameter_count() - 2 * head) * 2 + head * 4
    assert weight_bytes_read(cfg, torch.bfloat16) == (cfg.parameter_count() - head) * 2  # without it: the weight's


def test_a_plan_too_large_in_bfloat16_is_not_told_to_use_bfloat16(tiny, capsys):
    """The advice to use --dtype bfloat16 was given to runs already in bfloat16 (CUDA's default), where it
    changes nothing."""
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "1000000000", "--dtype", "bfloat16")
    assert_one_line_error(code, err, "not enough memory for these step costs")
    assert "--dtype bfloat16" not in err
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "1000000000")  # float32: it would help
    assert_one_line_error(code, err, "or use --dtype bfloat16")


@pytest.mark.parametrize("flag, value", [("--prefix", "100"), ("--new-tokens", "150")])
def test_projection_settings_without_alpha_are_refused(tiny, capsys, flag, value):
    """--prefix and --new-tokens only shape the projection, which --alpha asks for: without it they were
    taken and changed nothing (no projection, no word of why)."""
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64,256", flag, value)
    assert_one_line_error(code, err, f"{flag} sets the projection, which --alpha asks for")


def test_draft_cache_flags_of_the_fused_mode_are_said_to_set_nothing(tiny, capsys):
    """--draft-mode fused has no draft pass, so --draft-kv-budget and the like change nothing: generate says
    so, bench-steps took them silently (and recorded them in its JSON settings as if they had)."""
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64", "--draft-mode", "fused",
                           "--tree", "1,2,2")
    assert code == 0, err
    assert "note: --attention-sinks, --draft-kv-budget, --draft-window set nothing here" in err
    assert "--draft-mode fused has no draft pass" in err


def test_the_verify_costs_are_labelled_by_the_walk_that_ran(tiny, capsys):
    """With the batched walk (the GPU default) the verify pass computes every row's LM head, and the costs
    include it; the notes called them the forward with no LM head, which only the row walk's are."""
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64", "--walk", "batched")
    assert code == 0, err
    assert "Verify: the tree's forward on the full cache + the LM head of every row (the batched walk's)" in out
    assert "(no LM head)" not in out
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64")
    assert code == 0, err
    assert "Verify: the tree's forward on the full cache (no LM head)" in out


def test_a_one_node_verify_on_cuda_is_labelled_with_its_lm_head(tiny):
    """Where the step bodies run (CUDA), a root alone is AR's decode body, which computes its logits: the row walk's
    label said no LM head for every size (found by review)."""
    import dataclasses

    from longswift import RuntimeConfig, SpecConfig
    from longswift.bench.steps import StepBenchConfig, run_bench_steps
    from longswift.bench.steps_report import render

    spec = SpecConfig(draft_kv_budget=128, draft_window=32, attention_sinks=4)
    result = run_bench_steps(StepBenchConfig(shape="tiny", contexts=(64,), tree_nodes=(1, 4), reps=1, warmup=0,
                                             spec=spec, bandwidth_mib=8), RuntimeConfig(device="cpu", threads=1),
                             log=lambda s: None)
    assert "(no LM head)" in render(result)
    on_cuda = dataclasses.replace(result, identity={**result.identity, "device": "cuda:0"})
    assert "(no LM head; on CUDA a 1-node pass is the decode step, its LM head included)" in render(on_cuda)


def test_a_cost_whose_repetitions_spread_widely_makes_the_report_say_the_machine_was_busy(tiny, monkeypatch):
    """A reviewer's run on a busy machine measured a walk row at 79.98 ms at one context and 0.74 ms at the next,
    and the report, medians alone, said nothing. Each context keeps its costs' widest spread (slowest repetition
    over the median), and the report names the noisy contexts."""
    import dataclasses

    import longswift.bench.timing as timing
    from longswift import RuntimeConfig, SpecConfig
    from longswift.bench.steps import StepBenchConfig, run_bench_steps
    from longswift.bench.steps_report import render

    clock = iter([0.0, 1.0, 1.0, 2.0, 2.0, 12.0])  # three repetitions of 1, 1 and 10 s
    spreads: list[float] = []
    with monkeypatch.context() as patched:
        patched.setattr(timing.time, "perf_counter", lambda: next(clock))
        assert timing.median_seconds(lambda: None, 3, 0, lambda: None, spreads) == 1.0 and spreads == [10.0]

    spec = SpecConfig(draft_kv_budget=128, draft_window=32, attention_sinks=4)
    result = run_bench_steps(StepBenchConfig(shape="tiny", contexts=(64, 128), tree_nodes=(1, 4), reps=3, warmup=0,
                                             spec=spec, bandwidth_mib=8), RuntimeConfig(device="cpu", threads=1),
                             log=lambda s: None)
    assert all(c.spread >= 1.0 for c in result.costs)
    quiet = dataclasses.replace(result, costs=[dataclasses.replace(c, spread=1.1) for c in result.costs])
    assert "noisy" not in render(quiet)
    busy = dataclasses.replace(quiet, costs=[quiet.costs[0], dataclasses.replace(quiet.costs[1], spread=108.1)])
    assert ("- **noisy**: at 1 of 2 contexts a cost's slowest repetition took over 1.5x its median (at most 108.1x, "
            "at 128): the machine was busy") in render(busy)


def test_the_json_settings_name_the_draft_cache_and_the_node_budget(tiny, tmp_path, capsys):
    """The projection's verify pass is cut to --max-nodes and its draft pass reads the --draft-cache's cache,
    but neither was in the JSON's settings (a record from the Python API had no command line to tell)."""
    js = tmp_path / "steps.json"
    code, _, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64", "--draft-cache", "static",
                           "--max-nodes", "5", "--json", str(js))
    assert code == 0, err
    settings = json.loads(js.read_text())["settings"]
    assert settings["draft_cache"] == "static" and settings["max_nodes"] == 5


def test_the_report_says_whether_the_steps_ran_as_graphs(tiny, tmp_path, capsys):
    """A review: the identity held --cuda-graphs as given ('auto'), which says only that graphs run where they can;
    whether this run's steps were replayed showed only as an empty AR-eager column. On a CPU they never are."""
    js = tmp_path / "steps.json"
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64", "--json", str(js))
    assert code == 0, err
    ident = json.loads(js.read_text())["identity"]
    assert ident["cuda_graphs"] == "auto" and ident["graphs_replayed"] is False
    assert "--cuda-graphs is on: auto, here not replayed (eager)" in out


@pytest.mark.parametrize("max_nodes, cut", [(5, True), (7, False), (0, False)])
def test_the_projection_says_the_trie_was_cut_only_where_it_was(tiny, capsys, max_nodes, cut):
    """A review: the report said the trie was "cut to its N likeliest nodes" wherever its budget equalled
    --max-nodes, also where the trie (tree 1,1,1 + 1 n-gram path of 3: 7 nodes) has just that many."""
    code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "64,96", "--alpha", "0.5", "--prefix",
                             "64", "--new-tokens", "32", "--tree", "1,1,1", "--ngram-topk", "1", "--max-nodes",
                             str(max_nodes))
    assert code == 0, err
    assert ("likeliest nodes (--max-nodes)" in out) == cut


def test_a_static_draft_cache_is_timed_with_its_window_three_quarters_full(tiny, tmp_path, capsys):
    """A review: the draft pass was timed on a recent window half full for both partial caches, the dynamic one's
    average (it refills from empty). A static cache's window slides from its newest half to full, three quarters
    full on average. (--draft-kv-budget 128 = 4 sinks + 92 retrieved + a 32-entry window.)"""
    entries = {}
    for cache in ("dynamic", "static"):
        js = tmp_path / f"{cache}.json"
        code, out, err = run_cli(capsys, "bench-steps", *TINY_RUN, "--contexts", "160", "--draft-cache", cache,
                                 "--json", str(js))
        assert code == 0, err
        entries[cache] = json.loads(js.read_text())["contexts"][0]["draft_cache"]
        assert f"its recent window {'three quarters' if cache == 'static' else 'half'} full" in out
    assert entries == {"dynamic": 4 + 92 + 16, "static": 4 + 92 + 24}
