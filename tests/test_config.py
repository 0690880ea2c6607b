import pytest

from sglang_locks.config import LocksConfig


def test_defaults_valid():
    c = LocksConfig()
    assert (c.page_size, c.rank, c.token_budget, c.budget_pages) == (16, 8, 2048, 128)
    assert (c.prefilter, c.prefilter_rank, c.candidate_pages) == (0, 0, 0)  # every page scored in full
    assert c.sparse_decode == "triton"
    assert LocksConfig(prefilter=8).candidate_pages == 1024
    assert c.quantized


@pytest.mark.parametrize(
    "kwargs, field",
    [
        (dict(page_size=32), "page_size"),
        (dict(rank=17), "rank"),
        (dict(rank=0), "rank"),
        (dict(token_budget=32), "token_budget"),  # < (1 + 1 + 1) * 16
        (dict(token_budget=100), "token_budget"),  # not a page multiple
        (dict(sink_pages=-1), "sink_pages"),
        (dict(local_pages=-2), "local_pages"),
        (dict(dense_layers=(-1,)), "dense_layers"),
        (dict(summary_precision="int2"), "summary_precision"),
        (dict(gqa_aggregation="mean"), "gqa_aggregation"),
        (dict(min_step_tokens=-1), "min_step_tokens"),
        (dict(prefilter=-1), "prefilter"),
        (dict(prefilter_rank=9), "prefilter_rank"),
        (dict(rank=4, prefilter_rank=5), "prefilter_rank"),
        (dict(sparse_decode="fa3"), "sparse_decode"),
    ],
)
def test_invalid_values_name_the_field(kwargs, field):
    with pytest.raises(ValueError, match=field):
        LocksConfig(**kwargs)


def test_budget_error_gives_allowed_range():
    with pytest.raises(ValueError, match=r">= \(sink_pages \+ local_pages \+ 1\) \* page_size = 80"):
        LocksConfig(token_budget=64, sink_pages=2, local_pages=2)


@pytest.mark.parametrize("kwargs, context_len, message", [
    (dict(token_budget=2**40), 8192, r"token_budget must be a multiple of 16 in \[48, 8192\] \(up to the context "
                                     r"length 8192; a longer budget attends every page densely\), got 1099511627776"),
    (dict(token_budget=8208, sink_pages=2), 8200, r"in \[64, 8192\] .*, got 8208"),  # the top rounded down to a page
    (dict(token_budget=512, prefilter=17), 8192, r"prefilter must be in \[0, 16\] \(prefilter \* token_budget / "
                                                 r"page_size candidate pages, at most the 512 pages of the context "
                                                 r"length 8192\), got 17"),
    (dict(token_budget=48), 47, r"the context length 47 is below the smallest token_budget, \(sink_pages \+ "
                                r"local_pages \+ 1\) \* page_size = 48"),
])
def test_budget_and_prefilter_beyond_the_context_rejected(kwargs, context_len, message):
    with pytest.raises(ValueError, match=message):
        LocksConfig(**kwargs).check_context_len(context_len)


@pytest.mark.parametrize("kwargs, context_len", [
    (dict(token_budget=8192), 8192),
    (dict(token_budget=8192), 8207),
    (dict(token_budget=512, prefilter=16), 8192),
    (dict(token_budget=48), 48),
])
def test_budget_and_prefilter_within_the_context_accepted(kwargs, context_len):
    LocksConfig(**kwargs).check_context_len(context_len)


def test_dense_layers_normalised():
    assert LocksConfig(dense_layers=(3, 0, 3)).dense_layers == (0, 3)
