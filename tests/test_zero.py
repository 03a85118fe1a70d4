"""ZeRO as data (``helpers.zero``): DeepSpeed configs, their one-line errors, and the memory arithmetic checked
against the ZeRO paper's own figures (Rajbhandari et al. 2020: Figure 1 and Table 1, GB = 10**9 bytes)."""

from __future__ import annotations

import itertools
import os
import subprocess
import sys

import pytest

from helpers import CourseInputError
from helpers.workdir import REPO_ROOT
from helpers.zero import STAGE_PARTITIONS, check_zero_config, zero_config, zero_fits, zero_memory

PSI = 7_500_000_000  # the paper's 7.5B-parameter model
GB = 10**9
GIB = 2**30


def test_config_has_consistent_batch_arithmetic_and_the_stage():
    config = zero_config(2, micro_batch_size=16, world_size=2, gradient_accumulation=3, learning_rate=0.04)
    assert (config["train_batch_size"], config["train_micro_batch_size_per_gpu"]) == (16 * 3 * 2, 16)
    assert config["gradient_accumulation_steps"] == 3
    assert config["zero_optimization"] == {"stage": 2}
    assert config["optimizer"] == {"type": "SGD", "params": {"lr": 0.04, "momentum": 0.9}}
    assert config["zero_allow_untested_optimizer"] is True  # ZeRO was not tested with SGD: DeepSpeed asks for this
    assert "bf16" not in config and "fp16" not in config  # fp32, the CPU's


def test_config_variants_adam_offload_precision_and_stage_0():
    plain = zero_config(0, micro_batch_size=8, world_size=1)
    assert "zero_allow_untested_optimizer" not in plain  # no ZeRO optimizer at stage 0
    adam = zero_config(1, micro_batch_size=8, world_size=4, optimizer="adam", precision="bf16")
    assert adam["optimizer"]["type"] == "Adam" and adam["optimizer"]["params"]["torch_adam"] is True
    assert adam["bf16"] == {"enabled": True} and "zero_allow_untested_optimizer" not in adam
    offloaded = zero_config(3, micro_batch_size=8, world_size=4, optimizer="adam", offload_optimizer=True)
    assert offloaded["zero_optimization"] == {"stage": 3, "offload_optimizer": {"device": "cpu"}}
    assert offloaded["optimizer"]["params"]["torch_adam"] is False  # DeepSpeed's CPU Adam: ZeRO-Offload's own


def test_every_config_the_course_builds_passes_deepspeed_s_own_parser():
    for stage, offload, optimizer, precision in itertools.product(
        range(4), (False, True), ("sgd", "adam"), ("fp32", "bf16", "fp16")
    ):
        if stage == 0 and offload:
            continue
        config = zero_config(
            stage,
            micro_batch_size=8,
            world_size=4,
            gradient_accumulation=2,
            offload_optimizer=offload,
            optimizer=optimizer,
            precision=precision,
        )
        assert check_zero_config(config, 4) is config


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        (
            {"stage": 4},
            r"^stage=4: use 0, 1, 2 or 3\. ZeRO splits 0: nothing .*; 3: optimizer states, gradients, parameters\.$",
        ),
        ({"stage": True}, r"^stage=True: use 0, 1, 2 or 3\."),
        ({"micro_batch_size": 0}, r"^micro_batch_size=0: pass a whole number of at least 1\."),
        ({"world_size": 1.5}, r"^world_size=1\.5: pass a whole number"),
        ({"optimizer": "lamb"}, r"^optimizer='lamb': use one of 'sgd', 'adam'\.$"),
        ({"precision": "fp8"}, r"^precision='fp8': use one of 'fp32', 'bf16', 'fp16'\."),
        ({"stage": 0, "offload_optimizer": True}, r"^offload_optimizer=True needs stage 1, 2 or 3"),
        ({"offload_optimizer": "yes"}, r"^offload_optimizer='yes': pass True or False\.$"),
        ({"learning_rate": 0}, r"^learning_rate=0: pass a positive number"),
    ],
)
def test_bad_arguments_get_one_line(kwargs, message):
    arguments = {"stage": 2, "micro_batch_size": 16, "world_size": 2, **kwargs}
    with pytest.raises(CourseInputError, match=message) as caught:
        zero_config(arguments.pop("stage"), **arguments)
    assert "\n" not in str(caught.value)


GOOD = zero_config(2, micro_batch_size=16, world_size=2)


@pytest.mark.parametrize(
    ("config", "message"),
    [
        ({**GOOD, "zero_optimization": {"stage": 4}}, r"^zero_optimization\.stage=4: use 0, 1, 2 or 3\."),
        ({**GOOD, "zero_optimization": {"stage": "2"}}, r"^zero_optimization\.stage='2': use 0, 1, 2 or 3\."),
        (
            {**GOOD, "train_batch_size": 64},
            r"^train_batch_size=64 must equal .* = 16 x 1 x 2 = 32: set it to 32, or leave it out",
        ),
        (
            {**GOOD, "train_batch_size": 48, "gradient_accumulation_steps": None},
            r"^train_batch_size=48 is not a multiple of train_micro_batch_size_per_gpu x world_size = 16 x 2 = 32",
        ),
        ({"train_batch_size": 33}, r"^train_batch_size=33 is not divisible by .* = 1 x 2"),
        ({"gradient_accumulation_steps": 2}, r"sets neither train_batch_size nor train_micro_batch_size_per_gpu"),
        ({**GOOD, "train_micro_batch_size_per_gpu": 0}, r"^train_micro_batch_size_per_gpu=0: pass a whole number"),
        (
            {**GOOD, "zero_optimization": {"stage": 0, "offload_optimizer": {"device": "cpu"}}},
            r"^zero_optimization\.offload_optimizer with stage 0: offloading needs stage 1, 2 or 3",
        ),
        (
            {**GOOD, "zero_optimization": {"stage": 2, "offload_param": {"device": "cpu"}}},
            r"^zero_optimization\.offload_param with stage 2: only stage 3",
        ),
        (
            {key: value for key, value in GOOD.items() if key != "zero_allow_untested_optimizer"},
            r"""^optimizer 'SGD' with ZeRO stage 2: add "zero_allow_untested_optimizer": true""",
        ),
        ({**GOOD, "optimizer": {"type": "Adamm"}}, r"^optimizer type 'Adamm' is neither one of DeepSpeed's"),
        # DeepSpeed's own parser: a misspelt key, a removed feature, two precisions at once
        (
            {**GOOD, "zero_optimization": {"stage": 2, "stag": 3}},
            r"^DeepSpeed refuses the config: stag: Extra inputs are not permitted",
        ),
        ({**GOOD, "amp": {"enabled": True}}, r"^DeepSpeed refuses the config: NVIDIA Apex AMP .* has been removed"),
        (
            {**GOOD, "bf16": {"enabled": True}, "fp16": {"enabled": True}},
            r"^DeepSpeed refuses the config: bfloat16 and fp16 modes cannot be simultaneously enabled$",
        ),
        ("ds_config.json", r"^config='ds_config.json': pass the DeepSpeed config as a dict"),
    ],
)
def test_a_hand_written_config_gets_one_line_before_any_process_starts(config, message):
    if isinstance(config, dict):
        config = {key: value for key, value in config.items() if value is not None}
    with pytest.raises(CourseInputError, match=message) as caught:
        check_zero_config(config, world_size=2)
    assert "\n" not in str(caught.value)


def test_deepspeed_is_imported_without_its_accelerator_warning():
    """``load_deepspeed`` names the accelerator: a plain ``import deepspeed`` on a CPU-only machine warns that it
    was "unable to detect" a GPU, which a learner would take for an error."""
    code = (
        "import os; from helpers.zero import load_deepspeed; load_deepspeed(False); "
        "print(os.environ.get('DS_ACCELERATOR'))"
    )
    env = {key: value for key, value in os.environ.items() if key != "DS_ACCELERATOR"}
    done = subprocess.run(
        [sys.executable, "-c", code], cwd=REPO_ROOT, env=env, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    assert "unable to detect" not in done.stdout + done.stderr
    assert done.stdout.strip() == "None"  # the variable is not left behind for the processes the notebook starts


# the ZeRO paper, Table 1: GB per device for the 7.5B model, by device count: (stage 1, stage 2, stage 3)
PAPER_TABLE_1 = {
    1: (120, 120, 120),
    4: (52.5, 41.3, 30),
    16: (35.6, 21.6, 7.5),
    64: (31.4, 16.6, 1.88),
    256: (30.4, 15.4, 0.47),
    1024: (30.1, 15.1, 0.12),
}


def test_memory_is_the_paper_s_arithmetic_for_mixed_precision_adam():
    table = zero_memory(PSI, world_size=64)
    assert list(table.index) == [0, 1, 2, 3]
    assert list(table["partitions"]) == [STAGE_PARTITIONS[stage] for stage in range(4)]
    # by hand: 2 bytes of fp16 parameters, 2 of fp16 gradients, 12 of fp32 Adam states (copy, momentum, variance)
    assert table.loc[0, ["params_bytes", "grads_bytes", "optimizer_bytes"]].tolist() == [2 * PSI, 2 * PSI, 12 * PSI]
    assert table.loc[1, ["params_bytes", "grads_bytes", "optimizer_bytes"]].tolist() == [
        2 * PSI,
        2 * PSI,
        12 * PSI / 64,
    ]
    assert table.loc[2, ["params_bytes", "grads_bytes", "optimizer_bytes"]].tolist() == [
        2 * PSI,
        2 * PSI / 64,
        12 * PSI / 64,
    ]
    assert table.loc[3, "total_bytes"] == 16 * PSI / 64
    # the paper's Figure 1: 120 GB, 31.4 GB, 16.6 GB and 1.9 GB per device on 64 devices
    assert [round(total / GB, 1) for total in table["total_bytes"]] == [120.0, 31.4, 16.6, 1.9]
    assert table.loc[3, "total_gib"] == pytest.approx(1.875e9 / GIB)


@pytest.mark.parametrize("devices", sorted(PAPER_TABLE_1))
def test_memory_matches_the_paper_s_table_1(devices):
    table = zero_memory(PSI, world_size=devices)
    expected = PAPER_TABLE_1[devices]
    for stage, gb in zip((1, 2, 3), expected):
        assert table.loc[stage, "total_bytes"] / GB == pytest.approx(gb, abs=0.06)
    assert table.loc[0, "total_bytes"] == 16 * PSI  # data parallelism keeps everything everywhere


def test_one_stage_and_other_state_sizes():
    row = zero_memory(1_000_000, stage=2, world_size=4, param_bytes=4, grad_bytes=4, optimizer_bytes=4)
    assert list(row.index) == [2]  # fp32 SGD with momentum: 4 + 4/4 + 4/4 bytes per parameter
    assert row.loc[2, "total_bytes"] == 4_000_000 + 1_000_000 + 1_000_000
    with pytest.raises(CourseInputError, match=r"^stage=5: use 0, 1, 2 or 3\."):
        zero_memory(10, stage=5)
    with pytest.raises(CourseInputError, match=r"^param_count=0: pass a whole number of at least 1\."):
        zero_memory(0)
    with pytest.raises(CourseInputError, match=r"^optimizer_bytes=-1: pass a whole number of at least 0\."):
        zero_memory(10, optimizer_bytes=-1)


def test_which_stages_fit_a_device():
    # 7.5B on 64 devices: 120, 31.4, 16.6 and 1.9 GB; 16 GiB is 17.2 GB, 32 GiB is 34.4 GB
    assert zero_fits(PSI, 16, world_size=64, headroom=0)["fits"].tolist() == [False, False, True, True]
    assert zero_fits(PSI, 32, world_size=64, headroom=0)["fits"].tolist() == [False, True, True, True]
    assert zero_fits(PSI, 80, world_size=1, headroom=0)["fits"].tolist() == [False] * 4  # one device: ZeRO cannot help
    assert list(zero_fits(PSI, 16, world_size=64).columns) == ["partitions", "total_gib", "free_gib", "fits"]
    for bad in (0, -8, "16", True):
        with pytest.raises(CourseInputError, match=r"^device_gib=.*: pass one device's memory in GiB"):
            zero_fits(PSI, bad, world_size=64)


def test_a_fifth_of_the_device_is_kept_for_activations_by_default():
    # stage 2's 15.5 GiB fits 16 GiB on its own, but leaves 0.5 GiB: not with a fifth (3.2 GiB) kept free
    table = zero_fits(PSI, 16, world_size=64)
    assert table["fits"].tolist() == [False, False, False, True]
    assert table.loc[2, "free_gib"] == pytest.approx(16 - (2 + 14 / 64) * PSI / 2**30)
    assert zero_fits(PSI, 16, world_size=64, headroom=0.02)["fits"].tolist() == [False, False, True, True]
    for bad in (-0.1, 1, 1.5, "0.2", True):
        with pytest.raises(CourseInputError, match=r"^headroom=.*: pass the fraction of the device kept free"):
            zero_fits(PSI, 16, world_size=64, headroom=bad)


@pytest.fixture(scope="module")
def zero_measured(spark):
    """Stages 0, 2 and 3 measured on 2 processes (helpers.zero_measured: 25.2 M parameters, Adam in fp32)."""
    from helpers.zero_measured import measure_zero

    return measure_zero(world_size=2, spark=spark) / 2**20


@pytest.mark.slow
def test_each_rank_holds_less_at_stage_2_and_less_again_at_stage_3(zero_measured):
    """Measured on 2 cores: every run and both ranks held the same tensor bytes to 0.1 MiB (the tensors are
    deterministic), and their resident growth differed by under 15 MiB (allocator and communication buffers), while
    the stages differ by about 96 MiB (0 to 2) and 40 MiB (2 to 3) of tensors: margins of 20 MiB leave room for both."""
    for column in ("tensor_bytes", "rss_growth_bytes"):
        per_rank = zero_measured[column].unstack("rank")  # one row per stage, one column per rank
        assert (per_rank.loc[3] < per_rank.loc[2] - 20).all(), (column, per_rank)
        assert (per_rank.loc[2] < per_rank.loc[0] - 20).all(), (column, per_rank)
        assert (per_rank.max(axis=1) - per_rank.min(axis=1)).max() < 15, (column, per_rank)


@pytest.mark.slow
def test_the_measured_tensors_are_the_arithmetic_plus_deepspeed_s_own_copies(zero_measured):
    """Stage 0 holds what 4 + 4 + 8 bytes per parameter say; stage 2 also DeepSpeed's fp32 copy of the rank's share
    of the parameters (4 bytes per parameter / 2 ranks), to a MiB; DeepSpeed's estimators keep the same order."""
    from helpers.zero_measured import zero_estimates

    params = 6 * (2048**2 + 2048)
    held = zero_measured["tensor_bytes"].groupby("stage").mean()
    computed = zero_estimates(world_size=2) / 2**20
    assert abs(held[0] - computed.loc[0, "arithmetic_bytes"]) < 1
    assert abs(held[2] - computed.loc[2, "arithmetic_bytes"] - 4 * params / 2 / 2**20) < 1
    assert held[3] > computed.loc[3, "arithmetic_bytes"]  # stage 3's own buffers come on top
    estimates = computed["deepspeed_estimate_bytes"]
    assert estimates[0] > estimates[2] > estimates[3]
