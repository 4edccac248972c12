"""Losses: DIS hard mask, per-task windows, PPO clip, value clipping, |M| normalization, forks."""

from __future__ import annotations

import math

import pytest
import torch

from sapwood.learner.batch import ACTION, OBSERVATION, PROMPT, SUMMARY, TreeBatch, TreeBatchBuilder
from sapwood.learner.config import DISWindow, PolicyLossConfig
from sapwood.learner.errors import ConfigError
from sapwood.learner.flat import flatten
from sapwood.learner.losses import (
    aggregate,
    dis_policy_loss,
    explained_variance,
    metric_floats,
    ppo_clip_policy_loss,
    staleness_metrics,
    value_loss,
)
from sapwood.learner.trainer import token_windows


def leaf_grad(fn, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor, dict[str, float]]:
    x = x.clone().requires_grad_(True)
    loss, metrics = fn(x)
    loss.backward()
    assert x.grad is not None
    return loss.detach(), x.grad, metrics


# -------------------------------------------------------------------------- DIS
def test_dis_drops_tokens_outside_the_window_with_zero_loss_and_gradient() -> None:
    ratios = torch.tensor([0.5, 0.8, 1.5, 5.9, 7.0, 0.69, 6.01, math.exp(80.0)], dtype=torch.float64)
    logprob = torch.log(ratios) - 1.0
    rollout = torch.full_like(logprob, -1.0)
    adv = torch.tensor([1.0, -2.0, 0.5, 1.0, 3.0, 1.0, 1.0, 1.0], dtype=torch.float64)
    mask = torch.ones(8, dtype=torch.bool)
    loss, grad, metrics = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, 0.3, 5.0), logprob)
    inside = torch.tensor([False, True, True, True, False, False, False, False])  # 1-0.3 < r < 1+5
    expected = -(ratios * adv)[inside].sum() / 8  # dropped tokens stay in |M|
    assert torch.allclose(loss, expected)
    assert torch.allclose(grad[inside], -(ratios * adv)[inside] / 8)  # d(ratio)/d(logprob) = ratio: exact
    assert torch.equal(grad[~inside], torch.zeros(int((~inside).sum()), dtype=torch.float64))
    assert torch.isfinite(grad).all()
    assert metrics["policy/masked_frac"] == pytest.approx(5 / 8)
    assert metrics["policy/masked_low_frac"] == pytest.approx(2 / 8)
    assert metrics["policy/masked_high_frac"] == pytest.approx(3 / 8)


def logprob_with_ratio(target: torch.Tensor, *, strictly: str | None = None) -> torch.Tensor:
    """A log-prob x (rollout log-prob 0) whose ratio exp(x) is exactly ``target`` in its dtype, or the
    nearest x whose ratio is strictly ``"above"`` / ``"below"`` it. Scans 64 ulps either side of log(target)."""
    inf = torch.tensor(math.inf, dtype=target.dtype)
    centre = torch.log(target)
    candidates = [centre]
    for direction in (inf, -inf):
        x = centre
        for _ in range(64):
            x = torch.nextafter(x, direction)
            candidates.append(x)
    candidates.sort(key=lambda c: abs(float(c - centre)))
    for x in candidates:
        r = torch.exp(x)
        if (strictly is None and r == target) or (strictly == "above" and r > target) or (
            strictly == "below" and r < target
        ):
            return x
    raise AssertionError(f"no log-prob found with ratio {strictly or 'exactly'} {float(target)}")


@pytest.mark.parametrize("dtype", [torch.float32, torch.float64])
@pytest.mark.parametrize(("eps_low", "eps_high"), [(0.3, 5.0), (0.5, 3.0), (0.2, 0.28)])
def test_dis_ratios_exactly_on_the_window_bounds_are_dropped(
    dtype: torch.dtype, eps_low: float, eps_high: float
) -> None:
    lo, hi = torch.tensor(1 - eps_low, dtype=dtype), torch.tensor(1 + eps_high, dtype=dtype)
    logprob = torch.stack(
        [
            logprob_with_ratio(lo),
            logprob_with_ratio(hi),
            logprob_with_ratio(lo, strictly="above"),
            logprob_with_ratio(hi, strictly="below"),
        ]
    )
    rollout = torch.zeros(4, dtype=dtype)
    ratio = torch.exp(logprob - rollout)
    assert ratio[0] == lo
    assert ratio[1] == hi  # exactly on the bounds, as computed in this dtype
    assert lo < ratio[2]
    assert ratio[3] < hi
    adv = torch.ones(4, dtype=dtype)
    mask = torch.ones(4, dtype=torch.bool)
    _, grad, m = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, eps_low, eps_high), logprob)
    assert grad[0] == 0
    assert grad[1] == 0
    assert grad[2] == -ratio[2] / 4
    assert grad[3] == -ratio[3] / 4
    assert m["policy/masked_low_frac"] == 0.25
    assert m["policy/masked_high_frac"] == 0.25
    # Float32 windows given per token (token_windows' dtype) put the bounds at the same ratios.
    e_lo, e_hi = torch.full((4,), eps_low), torch.full((4,), eps_high)
    if dtype == torch.float32:
        _, grad32, _ = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, e_lo, e_hi), logprob)
        assert torch.equal(grad32, grad)


def test_dis_drops_a_nan_current_logprob_and_counts_it_as_masked() -> None:
    logprob = torch.tensor([math.nan, math.log(1.1), math.log(0.9), math.nan])
    rollout = torch.zeros(4)
    adv = torch.tensor([1.0, 2.0, -1.0, 1.0])
    mask = torch.tensor([True, True, True, False])
    loss, grad, m = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, 0.3, 5.0), logprob)
    assert torch.isfinite(loss)
    assert torch.isfinite(grad).all()
    assert loss.item() == pytest.approx(-(1.1 * 2.0 - 0.9 * 1.0) / 3, rel=1e-6)  # the NaN token stays in |M|
    assert grad[0] == 0
    assert grad[3] == 0
    assert m["policy/masked_frac"] == pytest.approx(1 / 3)
    assert m["policy/masked_nan_frac"] == pytest.approx(1 / 3)
    assert m["policy/masked_low_frac"] == 0
    assert m["policy/masked_high_frac"] == 0
    assert all(math.isfinite(v) for v in m.values())
    assert m["policy/ratio_max"] == pytest.approx(1.1)


@pytest.mark.parametrize("mode", ["token", "segment_mean"])
@pytest.mark.parametrize("n", [0, 3])
def test_dis_on_an_empty_batch_or_empty_mask_is_zero_with_zero_gradient_and_finite_metrics(
    n: int, mode: str
) -> None:
    """n = 0: a batch with no token at all; n = 3: tokens, none of them in M."""
    logprob = torch.full((n,), math.log(1.1))
    rollout, adv = torch.zeros(n), torch.ones(n)
    mask, segment = torch.zeros(n, dtype=torch.bool), torch.zeros(n, dtype=torch.int64)

    def loss_fn(lp: torch.Tensor) -> tuple[torch.Tensor, dict[str, torch.Tensor]]:
        return dis_policy_loss(lp, rollout, adv, mask, 0.3, 5.0, mode=mode, segment=segment)  # type: ignore[arg-type]

    loss, grad, tensors = leaf_grad(loss_fn, logprob)
    m = metric_floats(tensors)
    assert loss.item() == 0.0
    assert grad.shape == (n,)
    assert (grad == 0).all()
    assert all(math.isfinite(v) for v in m.values()), m
    assert m["policy/ratio_min"] == 1.0
    assert m["policy/ratio_max"] == 1.0
    assert m["policy/approx_kl"] == 0.0


def test_staleness_metrics_on_an_empty_batch_are_zero() -> None:
    m = metric_floats(staleness_metrics(torch.zeros(0, dtype=torch.int64), torch.zeros(0, dtype=torch.bool), 4))
    assert m == {"policy/staleness_mean": 0.0, "policy/staleness_max": 0.0}


@pytest.mark.parametrize("log_ratio", [89.5, 100.0, 1e4, math.inf, -1e4, -math.inf])
def test_dis_float32_log_ratios_beyond_exp_overflow_give_finite_gradients(log_ratio: float) -> None:
    assert not math.isfinite(torch.exp(torch.tensor(89.5, dtype=torch.float32)).item())  # exp overflows here
    logprob = torch.tensor([log_ratio - 1.0, -1.0], dtype=torch.float32)
    rollout = torch.full((2,), -1.0)
    adv = torch.tensor([3.0, 1.0])
    mask = torch.ones(2, dtype=torch.bool)
    loss, grad, m = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, 0.3, 5.0), logprob)
    assert torch.isfinite(loss)
    assert torch.isfinite(grad).all()
    assert grad[0] == 0
    assert grad[1] == pytest.approx(-0.5)
    assert loss.item() == pytest.approx(-0.5)
    assert m["policy/masked_frac"] == 0.5
    assert all(math.isfinite(v) for v in m.values())


def test_dis_lower_half_width_of_one_or_more_keeps_every_positive_ratio() -> None:
    logprob = torch.tensor([-60.0, -math.inf, -1.0, math.log(2.0) - 1.0])  # ratios e^-59, 0, 1, 2
    rollout = torch.full((4,), -1.0)
    adv, mask = torch.ones(4), torch.ones(4, dtype=torch.bool)
    _, grad1, m1 = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, 1.0, 0.5), logprob)
    assert [bool(g != 0) for g in grad1] == [True, False, True, False]  # 0 is on the bound 1 - 1; 2 > 1.5
    assert torch.isfinite(grad1).all()
    assert m1["policy/masked_low_frac"] == 0.25
    _, grad2, _ = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, 1.5, 0.5), logprob)
    assert [bool(g != 0) for g in grad2[:1]] == [True]
    assert grad2[1] == 0  # ratio 0: zero gradient either way


def test_dis_inside_the_window_is_the_exact_ratio_not_a_clamp() -> None:
    """PPO would clamp r=3.0 to 1.2 for a positive advantage; DIS keeps 3.0."""
    logprob = torch.log(torch.tensor([3.0], dtype=torch.float64))
    rollout = torch.zeros(1, dtype=torch.float64)
    adv = torch.ones(1, dtype=torch.float64)
    mask = torch.ones(1, dtype=torch.bool)
    dis, g_dis, _ = leaf_grad(lambda lp: dis_policy_loss(lp, rollout, adv, mask, 0.3, 5.0), logprob)
    ppo, g_ppo, m = leaf_grad(lambda lp: ppo_clip_policy_loss(lp, rollout, adv, mask), logprob)
    assert dis.item() == pytest.approx(-3.0)
    assert g_dis.item() == pytest.approx(-3.0)
    assert ppo.item() == pytest.approx(-1.2)
    assert g_ppo.item() == 0.0
    assert m["policy/clip_frac"] == 1.0


def test_dis_windows_are_per_task_family() -> None:
    b = TreeBatchBuilder()
    for fam in ("math", "swe", "other"):
        e = b.add_execution(f"e-{fam}", fam)
        p = b.add_run(e, -1, [1], PROMPT)
        b.add_run(e, p, [2, 3], ACTION, logprobs=[-1.0, -1.0], reward=1.0)
    batch = b.build()
    batch.validate()
    cfg = PolicyLossConfig(dis_default_window=DISWindow(0.1, 0.1))
    eps_low, eps_high = token_windows(batch, cfg)
    assert eps_low.tolist() == pytest.approx([0.3] * 3 + [0.8] * 3 + [0.1] * 3)
    assert eps_high.tolist() == pytest.approx([5.0] * 3 + [3.0] * 3 + [0.1] * 3)
    # Ratios 0.5 then 4.5 in every execution.
    ratios = torch.tensor([1.0, 0.5, 4.5] * 3)
    logprob = torch.log(ratios) + batch.rollout_logprob
    adv = torch.ones(9)
    _, grad, _ = leaf_grad(
        lambda lp: dis_policy_loss(lp, batch.rollout_logprob, adv, batch.trainable, eps_low, eps_high), logprob
    )
    kept = grad != 0
    # math keeps 4.5 not 0.5; swe keeps 0.5 not 4.5; the narrow default keeps neither.
    assert kept.tolist() == [False, False, True, False, True, False, False, False, False]


def test_default_windows_match_the_seeds() -> None:
    cfg = PolicyLossConfig()
    assert cfg.window("math") == DISWindow(0.3, 5.0)
    assert cfg.window("swe") == DISWindow(0.8, 3.0)
    assert cfg.window("terminal") == DISWindow(0.3, 5.0)
    with pytest.raises(ConfigError):
        DISWindow(0.0, 1.0)


# -------------------------------------------------------------------------- PPO
def test_ppo_clip_matches_the_textbook_formula() -> None:
    g = torch.Generator().manual_seed(0)
    logprob, old = torch.randn(20, generator=g, dtype=torch.float64), torch.randn(20, generator=g, dtype=torch.float64)
    adv = torch.randn(20, generator=g, dtype=torch.float64)
    mask = torch.rand(20, generator=g) < 0.8
    loss, _ = ppo_clip_policy_loss(logprob, old, adv, mask, clip_low=0.2, clip_high=0.28)
    r = torch.exp(logprob - old)
    per = -torch.minimum(r * adv, r.clamp(0.8, 1.28) * adv)
    assert torch.allclose(loss, per[mask].mean())


# ------------------------------------------------------------------------ value
def test_value_loss_clipping_and_metrics() -> None:
    old = torch.tensor([0.0, 0.0, 0.0], dtype=torch.float64)
    ret = torch.tensor([1.0, 1.0, -1.0], dtype=torch.float64)
    values = torch.tensor([0.5, -0.5, 0.1], dtype=torch.float64)
    mask = torch.ones(3, dtype=torch.bool)
    loss, grad, m = leaf_grad(lambda v: value_loss(v, old, ret, mask, clip=0.2), values)
    # token 0: unclipped (0.25) < clipped (0.64): clipped side wins, no gradient.
    # token 1: unclipped (2.25) > clipped (1.44): plain squared error.
    # token 2: unclipped (1.21) == clipped (1.21): same.
    per = torch.tensor([0.5 * 0.64, 0.5 * 2.25, 0.5 * 1.21], dtype=torch.float64)
    assert torch.allclose(loss, per.mean())
    assert grad[0].item() == 0.0
    assert grad[1].item() == pytest.approx((-0.5 - 1.0) / 3)
    assert m["critic/clip_frac"] == pytest.approx(1 / 3)
    plain, _ = value_loss(values, old, ret, mask, clip=None)
    assert torch.allclose(plain, (0.5 * (values - ret) ** 2).mean())


def test_explained_variance() -> None:
    ret = torch.tensor([1.0, 2.0, 3.0, 4.0])
    mask = torch.ones(4, dtype=torch.bool)
    assert explained_variance(ret, ret, mask) == pytest.approx(1.0)
    assert explained_variance(torch.zeros(4) + 2.5, ret, mask) == pytest.approx(0.0)
    assert math.isnan(explained_variance(torch.zeros(4), torch.ones(4), mask))


def test_staleness_metrics() -> None:
    version = torch.tensor([-1, 3, 5, 5])
    mask = torch.tensor([False, True, True, True])
    m = staleness_metrics(version, mask, current_version=6)
    assert m["policy/staleness_mean"] == pytest.approx((3 + 1 + 1) / 3)
    assert m["policy/staleness_max"] == 3.0


# ------------------------------------------------------------------ aggregation
def two_executions(x_segments: int) -> TreeBatch:
    """Execution X: the same 9 trainable tokens in 1 or 3 segments; execution Y: 3 tokens."""
    b = TreeBatchBuilder()
    x = b.add_execution("x", "swe")
    pieces = [[(ACTION, 2), (SUMMARY, 1)]] * 3
    node = b.add_run(x, -1, [1], PROMPT)
    for k, piece in enumerate(pieces):
        if k and x_segments == 3:
            node = b.add_run(x, -1, [1], PROMPT, segment_parent=node)
        for role, n in piece:
            node = b.add_run(x, node, [2] * n, role, logprobs=[-1.0] * n)
    b.set_reward(node, 1.0)
    y = b.add_execution("y", "swe")
    p = b.add_run(y, -1, [1], PROMPT)
    b.add_run(y, p, [3, 3, 3], ACTION, logprobs=[-1.0] * 3, reward=0.0)
    batch = b.build()
    batch.validate()
    return batch


def execution_weight(batch: TreeBatch, mode: str) -> float:
    """Total loss weight of execution X's tokens: d loss / d term, summed over X."""
    terms = torch.zeros(batch.num_tokens, requires_grad=True)
    loss = aggregate(
        terms, batch.trainable, mode=mode, segment=batch.segment_start(), weight=batch.token_weight()  # type: ignore[arg-type]
    )
    loss.backward()
    assert terms.grad is not None
    return float(terms.grad[batch.execution == 0].sum())


def test_splitting_into_more_segments_does_not_change_an_executions_weight() -> None:
    one, three = two_executions(1), two_executions(3)
    assert int(three.segment_start().unique().numel()) == 4
    assert execution_weight(one, "token") == pytest.approx(9 / 12)
    assert execution_weight(three, "token") == pytest.approx(9 / 12)
    # The segment_mean ablation baseline is what |M| normalization fixes.
    assert execution_weight(one, "segment_mean") == pytest.approx(1 / 2)
    assert execution_weight(three, "segment_mean") == pytest.approx(3 / 4)


def test_aggregate_rejects_unknown_modes() -> None:
    with pytest.raises(ConfigError, match="segment id"):
        aggregate(torch.ones(2), torch.ones(2, dtype=torch.bool), mode="segment_mean")
    with pytest.raises(ConfigError, match="unknown loss aggregation"):
        aggregate(torch.ones(2), torch.ones(2, dtype=torch.bool), mode="sample")  # type: ignore[arg-type]


# ------------------------------------------------------------------------ forks
def forked(n_branches: int) -> TreeBatch:
    b = TreeBatchBuilder()
    e = b.add_execution("fork", "math")
    p = b.add_run(e, -1, [1, 2], PROMPT)
    a = b.add_run(e, p, [3, 4, 5], ACTION, logprobs=[-0.5] * 3)
    o = b.add_run(e, a, [6], OBSERVATION)
    for k in range(n_branches):
        b.add_run(e, o, [7 + k, 7], ACTION, logprobs=[-0.5] * 2, reward=1.0)
    batch = b.build()
    batch.validate()
    return batch


def test_shared_tokens_count_once_and_branches_share_one_trajectorys_weight() -> None:
    """A 10-way fork: the prefix's 3 tokens weigh 1, each branch's tokens 1/10; |M| = 3 + 2 = 5."""
    batch = forked(10)
    n_m = int(batch.trainable.sum())
    assert n_m == 3 + 10 * 2
    weight = batch.token_weight()
    assert float(batch.execution_weight()[0]) == pytest.approx(5.0)
    adv = torch.ones(batch.num_tokens)
    logprob = batch.rollout_logprob.clone()  # ratio 1 everywhere: inside the window

    def tree_grad(w: torch.Tensor | None) -> torch.Tensor:
        return leaf_grad(
            lambda lp: dis_policy_loss(lp, batch.rollout_logprob, adv, batch.trainable, 0.3, 5.0, weight=w), logprob
        )[1]

    grad = tree_grad(weight)
    prefix = batch.trainable & (weight == 1)
    assert int(prefix.sum()) == 3
    assert torch.allclose(grad[prefix], torch.full((3,), -1.0 / 5))
    assert torch.allclose(grad[batch.trainable & ~prefix], torch.full((20,), -0.1 / 5))
    # The flattened per-trajectory computation with its own weights agrees.
    flat = flatten(batch)
    assert flat.num_sequences == 10
    idx, w = flat.cat_index(), flat.cat_weight()
    lp = logprob.clone().requires_grad_(True)
    loss, _ = dis_policy_loss(lp[idx], batch.rollout_logprob[idx], adv[idx], batch.trainable[idx], 0.3, 5.0, weight=w)
    loss.backward()
    assert lp.grad is not None
    assert torch.allclose(lp.grad, grad)
    # Unit weights (the ablation baseline) give every unique token the same coefficient: the branches
    # then carry 20/23 of the execution's weight instead of 2/5.
    unit = tree_grad(None)
    assert torch.allclose(unit[batch.trainable], torch.full((n_m,), -1.0 / n_m))


# ------------------------------------------------------------------ host syncs
def _forbid_host_reads(monkeypatch: pytest.MonkeyPatch) -> None:
    """Make every way of reading a tensor's value back to the host raise (a device sync on a GPU)."""

    def read(self: torch.Tensor, *args: object) -> object:
        raise AssertionError("a loss read a tensor value back to the host")

    for name in ("item", "tolist", "numpy", "__float__", "__int__", "__bool__", "__index__"):
        monkeypatch.setattr(torch.Tensor, name, read)


def test_losses_return_detached_tensor_metrics_without_reading_values_back(monkeypatch: pytest.MonkeyPatch) -> None:
    g = torch.Generator().manual_seed(3)
    n = 16
    logprob = (torch.randn(n, generator=g) - 1.0).requires_grad_(True)
    rollout = torch.randn(n, generator=g) - 1.0
    adv, ret = torch.randn(n, generator=g), torch.randn(n, generator=g)
    values = torch.randn(n, generator=g).requires_grad_(True)
    mask = torch.rand(n, generator=g) < 0.7
    weight = torch.rand(n, generator=g)
    version = torch.randint(0, 5, (n,), generator=g)
    eps_low, eps_high = torch.full((n,), 0.3), torch.full((n,), 5.0)
    with monkeypatch.context() as patched:
        _forbid_host_reads(patched)
        with pytest.raises(AssertionError, match="host"):
            float(torch.ones(()))  # the guard is armed
        calls = [
            dis_policy_loss(logprob, rollout, adv, mask, eps_low, eps_high, weight=weight),
            ppo_clip_policy_loss(logprob, rollout, adv, mask, weight=weight),
            value_loss(values, values.detach() + 0.1, ret, mask, weight=weight),
            (None, staleness_metrics(version, mask, current_version=6, weight=weight)),
            (None, {"critic/explained_var": explained_variance(values, ret, mask, weight)}),
        ]
        empty = torch.zeros(n, dtype=torch.bool)  # no trainable token: the defaults, still without a read
        calls.append(dis_policy_loss(logprob, rollout, adv, empty, 0.3, 5.0))
        calls.append((None, staleness_metrics(version, empty, current_version=6)))
    for _, metrics in calls:
        for key, v in metrics.items():
            assert isinstance(v, torch.Tensor), key
            assert v.dim() == 0, key
            assert not v.requires_grad, key
    floats = [metric_floats(m) for _, m in calls]
    assert all(isinstance(v, float) for f in floats for v in f.values())
    assert floats[0]["policy/ratio_min"] <= floats[0]["policy/ratio_mean"] <= floats[0]["policy/ratio_max"]
    assert floats[3]["policy/staleness_max"] == float((6 - version)[mask].max())
    assert floats[5]["policy/ratio_mean"] == 1.0
    assert floats[5]["policy/approx_kl"] == 0.0
    assert floats[6] == {"policy/staleness_mean": 0.0, "policy/staleness_max": 0.0}


def test_metric_floats_reads_the_same_floats_as_float() -> None:
    metrics = {
        "a": torch.tensor(1 / 3, dtype=torch.float32),
        "b": torch.tensor(2 / 3, dtype=torch.float64),
        "c": torch.tensor(7),
        "d": torch.tensor(math.nan),
        "e": 0.125,
    }
    out = metric_floats(metrics)
    assert list(out) == list(metrics)
    assert out["a"] == float(metrics["a"])
    assert out["b"] == 2 / 3
    assert out["c"] == 7.0
    assert out["e"] == 0.125
    assert math.isnan(out["d"])
    assert metric_floats({}) == {}
