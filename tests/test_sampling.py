"""The logits transform against direct references and transformers' processors; the sampler."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import (
    EtaLogitsWarper,
    MinNewTokensLengthLogitsProcessor,
    MinPLogitsWarper,
    RepetitionPenaltyLogitsProcessor,
    TemperatureLogitsWarper,
    TopKLogitsWarper,
    TopPLogitsWarper,
)

from longswift import sampling
from longswift.config import SamplingConfig
from longswift.errors import LongswiftError
from longswift.sampling import apply_penalty, banned_index, draw, penalty_window, probabilities, transform

V = 64


def logits_batch(seed: int, n: int = 6) -> torch.Tensor:
    g = torch.Generator().manual_seed(seed)
    return torch.randn(n, V, generator=g) * 3


def kept(x: torch.Tensor) -> torch.Tensor:
    return torch.isfinite(x)


def test_penalty_window_is_the_last_w_tokens():
    history = torch.arange(100, 120)
    assert penalty_window(history, 15, 4).tolist() == [111, 112, 113, 114]
    assert penalty_window(history, 3, 10).tolist() == [100, 101, 102]
    assert penalty_window(history, 15, 0).tolist() == []


def test_penalty_matches_direct_reference_and_transformers():
    x = logits_batch(0)
    g = torch.Generator().manual_seed(1)
    windows = torch.randint(0, V, (x.shape[0], 10), generator=g)
    windows[0, 5:] = -1  # padding is ignored
    theta = 1.3
    ours = apply_penalty(x, windows, theta)
    ref = x.clone()
    for row in range(x.shape[0]):
        for tok in {int(t) for t in windows[row] if t >= 0}:
            v = x[row, tok]
            ref[row, tok] = v / theta if v > 0 else v * theta
    assert torch.equal(ours, ref)
    hf = RepetitionPenaltyLogitsProcessor(theta)(windows[1:], x[1:].clone())
    assert torch.allclose(ours[1:], hf)
    assert torch.equal(apply_penalty(x, windows, 1.0), x)


@pytest.mark.parametrize("k", [1, 5, 40])
def test_top_k(k):
    x = logits_batch(k)
    ours = transform(x, torch.empty(6, 0, dtype=torch.long), SamplingConfig(top_k=k, min_p=0, repetition_penalty=1))
    hf = TopKLogitsWarper(k)(None, x.clone())
    assert torch.equal(kept(ours), kept(hf))
    assert (kept(ours).sum(-1) == k).all()


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999])
def test_top_p_matches_reference_and_transformers(p):
    x = logits_batch(int(p * 1000))
    ours = transform(x, torch.empty(6, 0, dtype=torch.long), SamplingConfig(top_p=p, min_p=0, repetition_penalty=1))
    hf = TopPLogitsWarper(p)(None, x.clone())
    assert torch.equal(kept(ours), kept(hf))
    probs = torch.softmax(x.double(), -1)
    for row in range(x.shape[0]):  # smallest most-likely set reaching mass p
        order = torch.argsort(probs[row], descending=True).tolist()
        mass, keep = 0.0, set()
        for tok in order:
            keep.add(tok)
            mass += float(probs[row, tok])
            if mass >= p:
                break
        assert {i for i in range(V) if kept(ours)[row, i]} == keep


def top_p_cases():
    g = torch.Generator().manual_seed(5)
    for case in range(120):
        v, n, dtype = (7, 64, 1000, 49152)[case % 4], (1, 3, 8)[case % 3], (torch.float32, torch.float64)[case % 2]
        x = torch.randn(n, v, generator=g, dtype=dtype) * 3
        if case % 5 == 0:
            x = torch.round(x * 2) / 2  # many ties, some at the cut
        if case % 7 == 0:
            x[:, ::3] = -math.inf  # banned or filtered before top-p
        if case % 11 == 0:
            x[:, : v // 2] = 1.0  # half the row tied
        if case % 13 == 0:
            x[0] = x[0, 0]  # a whole row tied
        if case % 17 == 0:
            x[:, 1::4] = torch.where(torch.rand(n, len(range(1, v, 4)), generator=g) < 0.5, 0.0, -0.0).to(dtype)
            x[:, 0] = 0.0  # signed zeros, tied with each other, at the top
        if case % 19 == 0 and n > 1:
            x[1, v // 3] = math.nan  # a row the softmax cannot make sense of
            x[-1, v // 2] = math.inf
        yield x if case % 23 else x.t().contiguous().t()  # and a non-contiguous layout


@pytest.mark.parametrize("p", [0.05, 0.5, 0.9, 0.999, 0.9999999])
def test_top_p_without_an_index_sort_drops_what_the_stable_order_drops(p):
    split_ties = 0  # rows whose cut falls inside a run of equal logits: the vocabulary order decides
    for x in top_p_cases():
        ours = sampling._top_p_drop_cpu(x, p)
        assert torch.equal(ours, sampling._top_p_drop_by_order(x, p))
        for row, drop in zip(x, ours):
            if not drop.all() and not torch.isnan(row).any():
                last = row[~drop].min()
                split_ties += bool(((row == last) & drop).any())
    assert split_ties >= 20  # the tie rule was exercised (26 to 74 rows per p)


def test_top_p_maps_a_non_suffix_through_the_stable_order(monkeypatch):
    """A one-ulp dip in the cumulative mass could make the dropped positions no suffix; then the
    value cut cannot say which tokens, and the stable order does."""
    x = torch.round(torch.randn(4, 300, generator=torch.Generator().manual_seed(3)) * 2) / 2

    def holes(sorted_x, p):
        drop = torch.zeros_like(sorted_x, dtype=torch.bool)
        drop[:, 5::2] = True  # dropped, kept, dropped...
        return drop

    monkeypatch.setattr(sampling, "_dropped_positions", holes)
    ours = sampling._top_p_drop_cpu(x, 0.5)
    assert (ours.sum(-1) == 148).all()
    for row, drop in zip(x.tolist(), ours):  # the stable order, written out: descending, ties by index
        order = sorted(range(len(row)), key=lambda i: (-row[i], i))
        assert sorted(order[5::2]) == drop.nonzero().flatten().tolist()


@pytest.mark.parametrize("m", [0.01, 0.1, 0.5])
def test_min_p(m):
    x = logits_batch(int(m * 100) + 7)
    ours = transform(x, torch.empty(6, 0, dtype=torch.long), SamplingConfig(min_p=m, repetition_penalty=1))
    hf = MinPLogitsWarper(m)(None, x.clone())
    assert torch.equal(kept(ours), kept(hf))
    probs = torch.softmax(x, -1)
    assert torch.equal(kept(ours), probs >= m * probs.max(-1, keepdim=True).values)


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
def test_min_p_keeps_a_token_exactly_at_the_threshold(dtype):
    """Probabilities [0.5, 0.25, 0.125, 0.125] (exact in binary) and min_p 0.5: the threshold is 0.25, and
    the token at exactly 0.25 stays, as transformers' MinPLogitsWarper keeps it (a `<=` cut would drop it;
    random logits never land on the threshold, so test_min_p could not tell)."""
    x = torch.tensor([[4.0, 2.0, 1.0, 1.0]], dtype=dtype).log()
    assert torch.softmax(x, -1).tolist() == [[0.5, 0.25, 0.125, 0.125]]  # the tie with the threshold is exact
    ours = transform(x, torch.empty(1, 0, dtype=torch.long), SamplingConfig(min_p=0.5, repetition_penalty=1))
    assert kept(ours).tolist() == [[True, True, False, False]]
    assert torch.equal(kept(ours), kept(MinPLogitsWarper(0.5)(None, x.clone())))


@pytest.mark.parametrize("eta", [0.0009, 0.02, 0.3])
def test_eta(eta):
    x = logits_batch(int(eta * 1e4))
    ours = transform(x, torch.empty(6, 0, dtype=torch.long), SamplingConfig(eta=eta, min_p=0, repetition_penalty=1))
    hf = EtaLogitsWarper(eta)(None, x.clone())
    assert torch.equal(kept(ours), kept(hf))
    probs = torch.softmax(x.double(), -1)
    entropy = -(probs * probs.log()).sum(-1, keepdim=True)
    threshold = torch.clamp(math.sqrt(eta) * torch.exp(-entropy), max=eta)
    expect = (probs >= threshold) | (x == x.max(-1, keepdim=True).values)
    assert torch.equal(kept(ours), expect)


@pytest.mark.parametrize("banned", [(), (3, 17, 40)])
def test_eta_after_another_filter_or_a_ban_still_filters(banned):
    """Earlier filters and bans leave -inf logits, whose 0 * -inf terms would make the entropy NaN and turn
    eta off (the chain above uses an eta too small to drop anything, so it could not tell)."""
    x = logits_batch(7)
    cfg = SamplingConfig(top_k=40, eta=0.1, min_p=0, repetition_penalty=1, banned_ids=banned)
    ours = transform(x, torch.empty(6, 0, dtype=torch.long), cfg)
    hf = x.clone()
    if banned:
        hf[:, list(banned)] = -math.inf
    hf = EtaLogitsWarper(0.1)(None, TopKLogitsWarper(40)(None, hf))
    assert torch.equal(kept(ours), kept(hf))
    assert (kept(ours).sum(-1) < 40).all()  # eta dropped tokens top-k kept


def test_top_p_keeps_the_smallest_set_that_reaches_p_exactly():
    """Four equal tokens and p = 0.5: the first two reach it; the third's mass before it is 0.5, so it goes."""
    x = torch.zeros(1, 4, dtype=torch.float64)
    ours = transform(x, torch.empty(1, 0, dtype=torch.long), SamplingConfig(top_p=0.5, min_p=0, repetition_penalty=1))
    assert kept(ours).tolist() == [[True, True, False, False]]  # (ties go in vocabulary order)
    assert kept(TopPLogitsWarper(0.5)(None, x.clone())).sum() == 2  # transformers keeps as many (others of the tie)


def test_a_draw_never_returns_a_token_of_zero_probability_at_the_uniforms_ends():
    """u = 0 must not land on a leading -inf token (searchsorted's right side), and u just below 1 must not
    run past a cdf whose total rounds below 1 onto a trailing -inf token (the target scales by the total)."""
    cfg = SamplingConfig(seed=0)
    row = torch.tensor([[-math.inf, 0.0, 1.0]])
    assert sampling.draw_rows(row, cfg, torch.zeros(1, dtype=torch.float64)).item() == 1
    for seed in range(1000):  # a row whose cdf total rounds below 1, its last token banned
        row = torch.randn(1, 10, generator=torch.Generator().manual_seed(seed))
        row[0, -1] = -math.inf
        if torch.cumsum(torch.softmax(row.double(), -1), -1)[0, -1].item() < 1.0:
            break
    else:
        pytest.fail("no row with a cdf total below 1")
    top = torch.tensor([1 - 2**-53], dtype=torch.float64)  # the largest value torch.rand returns in float64
    assert sampling.draw_rows(row, cfg, top).item() == 8


def test_a_draw_reads_its_cdf_in_float64():
    """The draw promises float64 probabilities: a uniform that falls between a token's float64 cdf and its float32
    rounding draws the token float64 says (a draw through a float32 softmax passed every test: a review's
    mutation)."""
    cfg = SamplingConfig(seed=0)
    for seed in range(100):  # float32 logits whose first cdf step (over the total) float32 rounds up
        row = torch.randn(1, 8, generator=torch.Generator().manual_seed(seed)) * 3
        wide = torch.softmax(row.double(), -1)[0].tolist()
        narrow = torch.softmax(row, -1)[0].double().tolist()
        low, high = wide[0] / sum(wide), narrow[0] / sum(narrow)
        if high - low > 1e-9:
            break
    else:
        pytest.fail("no row whose float32 probability rounds up")
    u = torch.tensor([(low + high) / 2], dtype=torch.float64)  # past float64's cdf, short of float32's
    assert sampling.draw_rows(row, cfg, u).item() == 1


def test_full_chain_matches_transformers_processors_in_order():
    x = logits_batch(99)
    g = torch.Generator().manual_seed(3)
    windows = torch.randint(0, V, (6, 12), generator=g)
    cfg = SamplingConfig(temperature=0.7, top_k=30, top_p=0.9, min_p=0.05, eta=0.001, repetition_penalty=1.2)
    ours = transform(x, windows, cfg)
    hf = x.clone()
    for proc in [RepetitionPenaltyLogitsProcessor(1.2), TemperatureLogitsWarper(0.7), TopKLogitsWarper(30),
                 TopPLogitsWarper(0.9), MinPLogitsWarper(0.05), EtaLogitsWarper(0.001)]:
        hf = proc(windows, hf)
    assert torch.equal(kept(ours), kept(hf))
    # Bit for bit: the penalty before the temperature, as transformers orders them (temperature first is
    # the same in exact arithmetic and differs in the last bit of about one entry in ten).
    assert torch.equal(ours[kept(ours)], hf[kept(hf)])


def test_banned_ids_come_first_like_transformers_min_new_tokens():
    """The ban (--ignore-eos) is transformers' min_new_tokens EOS mask: -inf before temperature and
    filters, so a banned top token does not set min-p's threshold or take top-p's mass."""
    x = logits_batch(41)
    g = torch.Generator().manual_seed(4)
    windows = torch.randint(0, V, (6, 12), generator=g)
    banned = tuple(sorted({int(x[0].argmax()), int(x[1].argmax()), 7}))
    cfg = SamplingConfig(temperature=0.7, top_k=30, top_p=0.6, min_p=0.2, eta=0.001, repetition_penalty=1.2,
                         banned_ids=banned)
    before = x.clone()
    ours = transform(x, windows, cfg)
    assert torch.equal(x, before)  # the caller's logits are not modified
    hf = x.clone()
    for proc in [RepetitionPenaltyLogitsProcessor(1.2), MinNewTokensLengthLogitsProcessor(12, 1, list(banned)),
                 TemperatureLogitsWarper(0.7), TopKLogitsWarper(30), TopPLogitsWarper(0.6), MinPLogitsWarper(0.2),
                 EtaLogitsWarper(0.001)]:
        hf = proc(windows, hf)
    assert torch.equal(kept(ours), kept(hf))
    assert torch.allclose(ours[kept(ours)], hf[kept(hf)], atol=1e-6)
    assert not kept(ours)[:, list(banned)].any()
    # Banning after the filters would keep another set: the order is what is being tested.
    late = transform(x, windows, SamplingConfig(**{**cfg.__dict__, "banned_ids": ()}))
    late[:, list(banned)] = -math.inf
    assert not torch.equal(kept(late), kept(ours))


def test_greedy_never_picks_a_banned_token():
    x = logits_batch(6)
    banned = tuple(int(t) for t in x.argmax(-1))  # every row's argmax
    cfg = SamplingConfig(temperature=0, repetition_penalty=1.0, banned_ids=banned)
    for row in range(6):
        pick = draw(transform(x[row : row + 1], torch.empty(1, 0, dtype=torch.long), cfg)[0], cfg, None)
        assert pick not in banned
        assert pick == int(x[row].masked_fill(torch.isin(torch.arange(V), torch.tensor(banned)), -math.inf).argmax())


def test_banned_ids_are_canonical_and_checked():
    assert SamplingConfig(banned_ids=[5, 2, 5]).banned_ids == (2, 5)  # as read back from a checkpoint's JSON
    with pytest.raises(LongswiftError, match=r"^SamplingConfig.banned_ids must be non-negative; got -1"):
        SamplingConfig(banned_ids=(-1,))


def test_greedy_is_penalised_argmax():
    x = logits_batch(5)
    windows = x.argmax(-1, keepdim=True)  # penalise each row's argmax
    cfg = SamplingConfig(temperature=0, repetition_penalty=50.0)
    for row in range(6):
        t = transform(x[row : row + 1], windows[row : row + 1], cfg)[0]
        assert draw(t, cfg, None) == int(apply_penalty(x[row : row + 1], windows[row : row + 1], 50.0).argmax())
        assert draw(t, cfg, None) != int(windows[row])


def test_draw_distribution_chi_square():
    """20000 draws over 6 tokens (one at probability 0): chi-square with 4 degrees of freedom
    against the critical value 18.47 (false-alarm rate 1e-3)."""
    logits = torch.tensor([[0.0, 1.0, -1.0, 2.0, 0.5, -math.inf]])
    cfg = SamplingConfig(min_p=0, repetition_penalty=1)
    t = transform(logits, torch.empty(1, 0, dtype=torch.long), cfg)[0]
    p = probabilities(t[None])[0]
    g = torch.Generator().manual_seed(1234)
    n = 20000
    counts = torch.zeros(6)
    for _ in range(n):
        counts[draw(t, cfg, g)] += 1
    assert counts[5] == 0
    expected = p[:5] * n
    chi2 = float(((counts[:5] - expected) ** 2 / expected).sum())
    assert chi2 < 18.47, chi2


def test_same_seed_same_draws():
    t = transform(logits_batch(8)[:1], torch.empty(1, 0, dtype=torch.long), SamplingConfig(min_p=0))[0]
    cfg = SamplingConfig()

    def draws(seed):
        g = torch.Generator().manual_seed(seed)
        return [draw(t, cfg, g) for _ in range(50)]

    assert draws(5) == draws(5)
    assert draws(5) != draws(6)


@pytest.mark.parametrize("bad", [dict(temperature=-1), dict(top_p=0), dict(top_p=1.5), dict(min_p=1.0),
                                 dict(eta=-0.1), dict(top_k=-2), dict(repetition_penalty=0),
                                 dict(penalty_window=-1), dict(temperature=float("nan"))])
def test_bad_sampling_values_are_refused(bad):
    with pytest.raises(LongswiftError, match="must be"):
        SamplingConfig(**bad)


def test_a_ban_list_is_one_tensor_while_held_and_lists_no_one_holds_are_freed():
    """A captured CUDA graph reads the ban's index tensor by address, and a capture may not copy one
    from the host: a list's tensor is the same one for as long as anything holds it (StepGraphs holds the
    one it binds), however many lists come between. Lists no one holds are freed past the recent few: every
    list was kept for the process, and a service banning other tokens per request grew on every request."""
    import gc

    banned_index.cache_clear()
    first = banned_index((3, 9), torch.device("cpu"))
    for n in range(100):  # more lists than any bounded cache of the past held
        banned_index((n, n + 1000), torch.device("cpu"))
    assert banned_index((3, 9), torch.device("cpu")) is first and first.tolist() == [3, 9]
    gc.collect()
    assert banned_index.held() == banned_index.RECENT  # (the recent ones, `first` among them)
    del first
    for n in range(100, 100 + banned_index.RECENT):
        banned_index((n,), torch.device("cpu"))
    gc.collect()
    assert banned_index.held() == banned_index.RECENT


def test_graphs_that_bound_a_ban_keep_its_tensor_through_other_lists(tmp_path):
    """StepGraphs.bind_sampling holds the ban's index tensor that its SAMPLED graphs read: other requests' lists
    (more than the recent ones kept) neither free it nor make a capture find another (its replays would read
    freed memory; a capture cannot make one)."""
    import gc

    from conftest import tiny_hf_model

    import longswift
    from longswift.runtime.cache import FullKVCache
    from longswift.runtime.cuda_graphs import StepGraphs

    engine = longswift.load(tiny_hf_model("llama", seed=2), dtype="float32", heads=None)
    graphs = StepGraphs(engine.model, FullKVCache(engine.model.cfg, 16, torch.float32, torch.device("cpu")),
                        capture=False)
    graphs.bind_sampling(torch.zeros(16, dtype=torch.long), SamplingConfig(banned_ids=(5, 7), seed=1))
    bound_address = graphs.banned.data_ptr()
    for n in range(3 * banned_index.RECENT):
        banned_index((n, n + 20), torch.device("cpu"))
    gc.collect()
    again = banned_index((5, 7), torch.device("cpu"))
    assert again is graphs.banned and again.data_ptr() == bound_address
