"""The tree-from-traffic rules (gateway/tree.py), checked on generated sessions."""

from __future__ import annotations

from hypothesis import given, settings
from hypothesis import strategies as st

from sapwood.gateway.tree import SessionTree, common_prefix_len, contains_run

ids = st.lists(st.integers(min_value=0, max_value=50), min_size=1, max_size=20)


def test_first_call_is_root() -> None:
    assert SessionTree().add([1, 2], [3]).kind == "root"


@given(prompt=ids, out=ids, more=st.lists(ids, min_size=1, max_size=5))
@settings(max_examples=200)
def test_prompt_extending_the_last_context_is_the_next_call(
    prompt: list[int], out: list[int], more: list[list[int]]
) -> None:
    tree = SessionTree()
    tree.add(prompt, out)
    ctx = prompt + out
    for i, extra in enumerate(more):
        placed = tree.add(ctx + extra, extra)
        assert (placed.kind, placed.parent, placed.prefix_len) == ("next", i, len(ctx))
        ctx = ctx + extra + extra


@given(prompt=ids, out=ids, cut=st.integers(min_value=1), tail=ids)
def test_divergence_from_an_earlier_context_is_a_fork_at_the_divergence(
    prompt: list[int], out: list[int], cut: int, tail: list[int]
) -> None:
    tree = SessionTree()
    tree.add(prompt, out)
    tree.add(prompt + out + [99], [98])  # the chain went on
    ctx = prompt + out
    j = 1 + cut % len(ctx)  # shared prefix length, 1..len(ctx)
    new_prompt = [*ctx[:j], 200, *tail]  # 200 never occurs in generated ids: diverges at j
    placed = tree.place(new_prompt)
    assert placed.kind == "fork"
    assert placed.prefix_len == j
    assert placed.parent is not None
    assert tree.contexts[placed.parent][:j].tolist() == new_prompt[:j]


@given(prompt=ids, out=ids, head=ids)
def test_prompt_holding_the_last_output_but_not_the_context_is_a_segment_with_summary(
    prompt: list[int], out: list[int], head: list[int]
) -> None:
    tree = SessionTree()
    tree.add(prompt, out)
    summary_prompt = [300, *head, *out]  # 300 starts it: it does not extend the old context
    placed = tree.place(summary_prompt)
    assert (placed.kind, placed.summary_of) == ("segment", 0)


@given(prompt=ids, out=ids, other=st.lists(st.integers(min_value=100, max_value=150), min_size=1))
def test_prompt_sharing_nothing_is_a_segment_without_summary(
    prompt: list[int], out: list[int], other: list[int]
) -> None:
    tree = SessionTree()
    tree.add(prompt, out)
    placed = tree.place(other)
    assert (placed.kind, placed.parent, placed.summary_of) == ("segment", None, None)


@given(calls=st.lists(st.tuples(ids, ids), min_size=1, max_size=8))
def test_any_placement_shares_exactly_its_prefix_with_its_parent(calls: list[tuple[list[int], list[int]]]) -> None:
    tree = SessionTree()
    for prompt, out in calls:
        placed = tree.place(prompt)
        if placed.parent is not None:
            parent_ctx = tree.contexts[placed.parent]
            assert placed.prefix_len == common_prefix_len(prompt, parent_ctx) > 0
        if placed.summary_of is not None:
            assert contains_run(prompt, tree.outputs[placed.summary_of])
        tree.add(prompt, out)


def test_contains_run_edges() -> None:
    assert contains_run([1, 2, 3], [2, 3])
    assert not contains_run([1, 2, 3], [3, 2])
    assert not contains_run([1, 2], [])
    assert not contains_run([1], [1, 1])


def _naive_prefix(a: list[int], b: list[int]) -> int:
    n = 0
    while n < min(len(a), len(b)) and a[n] == b[n]:
        n += 1
    return n


def _naive_contains(h: list[int], n: list[int]) -> bool:
    return bool(n) and any(h[i : i + len(n)] == n for i in range(len(h) - len(n) + 1))


wide = st.lists(st.sampled_from([0, 1, 255, 256, 2**31 - 1, 2**40 + 7, 2**63 - 1]), max_size=12)


@given(a=wide, b=wide)
@settings(max_examples=300)
def test_the_array_comparisons_equal_the_plain_definitions(a: list[int], b: list[int]) -> None:
    assert common_prefix_len(a, b) == _naive_prefix(a, b)
    assert contains_run(a, b) == _naive_contains(a, b)
    assert contains_run(a + b, b) == bool(b)


def test_a_byte_match_across_two_ids_is_not_a_run() -> None:
    # 256 = 00 01 00.. and 1 = 01 00..: the bytes of [1, 0] occur in those of [256, 0, 0] one byte in
    assert not contains_run([256, 0, 0], [1, 0])
    assert not contains_run([256, 0], [1])
    assert contains_run([2**8, 1, 0], [1, 0])
    assert common_prefix_len([], [1]) == 0
    assert common_prefix_len([5, 6], [5, 6]) == 2
