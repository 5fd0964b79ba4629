"""The LLM judge through real litellm against a real OpenAI-protocol server on 127.0.0.1.

The fake server (:mod:`tests.fake_openai`) plays the judge model's replies; the tests
check the judgement and what actually went over the wire (the prompt, its options, and
that the references never leave the host).
"""

from __future__ import annotations

import dataclasses
import json
import os
import socket
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from pytest_automedbench.evaluators.schema import FormatReport
from pytest_automedbench.events import parse_events
from pytest_automedbench.scoring.llm_judge import (
    CALL_CHARS,
    DIGEST_HEAD_CALLS,
    DIGEST_TAIL_CALLS,
    PLAN_FILE_CHARS,
    SYSTEM_PROMPT,
    LlmJudgeConfig,
    LlmJudgement,
    UnusableAnswer,
    build_prompt,
    digest_trajectory,
    parse_answer,
)
from pytest_automedbench.scoring.llm_judge import judge_llm as ask_llm_judge
from pytest_automedbench.scoring.rubric import load_rubric
from pytest_automedbench.scoring.rules import Events, JudgeContext, judge_rules
from tests.fake_openai import ErrorReply, FakeOpenAI, TextReply

os.environ.setdefault("LITELLM_LOCAL_MODEL_COST_MAP", "True")

MODEL = "openai/judge-model"
RUBRIC = load_rubric()
ALL_IDS = [item.id for item in RUBRIC.items]
LITE_AUTO = [item.id for item in RUBRIC.items if "lite" in item.auto_pass]
CANARY = "CANARY-7f3e9b-reference-answer"
PLAN = """# Plan
1. Compare nnU-Net, TotalSegmentator and thresholding; pick nnU-Net.
2. Install it, check the environment and the inputs' spacing.
3. Pilot on one case, check the mask's shape and labels, then run all cases.
"""
REPORT = FormatReport(
    valid=False, n_expected=4, n_present=3, n_valid=2, problems=["case_0004: missing"]
)


def judge_llm(
    ctx: JudgeContext, events: Events, report: FormatReport, cfg: LlmJudgeConfig
) -> LlmJudgement:
    """The LLM judge as the scoring asks it: the rule judge's items to fall back on."""
    return ask_llm_judge(ctx, events, report, cfg, fallback=judge_rules(ctx, events))


@pytest.fixture
def server(monkeypatch: pytest.MonkeyPatch) -> Iterator[FakeOpenAI]:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge-test-0123456789")
    with FakeOpenAI() as fake:
        yield fake


def make_ctx(tmp_path: Path, tier: str = "standard", plan: str | None = PLAN) -> JudgeContext:
    plan_dir = tmp_path / "workspace" / "plan"
    plan_dir.mkdir(parents=True, exist_ok=True)
    if plan is not None:
        (plan_dir / "plan.md").write_text(plan)
    return JudgeContext(
        tier=tier,
        track="segmentation",
        plan_dir=plan_dir,
        method_keywords=["nnu-net|nnunet", "totalsegmentator", "threshold"],
        n_cases=4,
        public_path="/data/public",
        submission_path="/ws/outputs",
        input_markers=("ct.nii.gz",),
        output_markers=("outputs/",),
    )


def tool(
    seq: int,
    code: str,
    exit_code: int = 0,
    outputs: int = 0,
    stdout: str = "",
    stderr: str = "",
) -> dict[str, Any]:
    return {
        "v": 2,
        "seq": seq,
        "t": float(seq),
        "kind": "tool_result",
        "turn": seq // 2 + 1,
        "tool": "execute",
        "language": "bash",
        "code": code,
        "exit_code": exit_code,
        "stdout": stdout,
        "stderr": stderr,
        "observed": {"output_files": outputs},
    }


EVENTS = parse_events(
    [
        {"v": 2, "seq": 0, "t": 0.0, "kind": "start"},
        tool(1, "pip install nnunetv2 && python -c 'import torch; print(torch.__version__)'"),
        tool(
            2, "python -c 'import nibabel as n; print(n.load(\"/data/public/a/ct.nii.gz\").shape)'"
        ),
        tool(3, "python solve.py --cases case_0001", exit_code=1, stderr="CUDA out of memory"),
        tool(4, "python solve.py --cases case_0001", outputs=1),
        tool(5, "python -c 'print(np.unique(load(\"/ws/outputs/case_0001.nii.gz\")))'", outputs=1),
        tool(6, "python solve.py", outputs=3),
    ]
)


def config(server: FakeOpenAI, **overrides: Any) -> LlmJudgeConfig:
    settings: dict[str, Any] = {"model": MODEL, "api_base": server.url, "timeout_s": 10.0}
    return LlmJudgeConfig(**{**settings, **overrides})


def answer(
    ids: list[str],
    no: tuple[str, ...] = (),
    codes: list[dict[str, Any]] | None = None,
    tag: str = "",
) -> str:
    """A judge reply: every id "yes" except those in ``no``."""
    items = {
        item_id: {"answer": "no" if item_id in no else "yes", "rationale": f"{tag}why {item_id}"}
        for item_id in ids
    }
    return json.dumps({"items": items, "error_codes": codes or []})


def asked_ids(tier: str) -> list[str]:
    return [item.id for item in RUBRIC.items if tier not in item.auto_pass]


def user_prompt(server: FakeOpenAI, n: int = 0) -> str:
    messages = server.requests[n].body["messages"]
    return "\n".join(m["content"] for m in messages if m["role"] == "user")


def test_a_valid_verdict_scores_every_item_with_its_rationale(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    codes = [{"code": "E4", "evidence": "CUDA out of memory in the pilot", "seq": 3}]
    server.push(TextReply(answer(ALL_IDS, no=("s3_fixed_before_batch",), codes=codes)))
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server))
    assert [i.id for i in result.items] == ALL_IDS
    scores = {i.id: i.score for i in result.items}
    assert scores["s3_fixed_before_batch"] == 0.0
    assert all(s == 1.0 for k, s in scores.items() if k != "s3_fixed_before_batch")
    pilot = next(i for i in result.items if i.id == "s3_pilot")
    assert pilot.rationale == "why s3_pilot" and pilot.evidence == f"llm:{MODEL}: yes"
    assert pilot.question == RUBRIC.item("s3_pilot").text("segmentation") and not pilot.auto
    fixed = next(i for i in result.items if i.id == "s3_fixed_before_batch")
    assert fixed.evidence == f"llm:{MODEL}: no"
    assert [(c.code, c.rule, c.evidence, c.seq, c.turn) for c in result.codes] == [
        ("E4", "llm", "CUDA out of memory in the pilot", 3, 2)
    ]
    assert result.judge == f"llm:{MODEL}" and result.fallback_reason is None
    assert not result.cached and len(result.prompt_sha256) == 64
    assert len(server.requests) == 1


def test_the_request_is_deterministic_json_mode_and_complete(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.push(TextReply(answer(ALL_IDS)))
    judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server))
    body = server.requests[0].body
    assert body["model"] == "judge-model"
    assert body["temperature"] == 0
    assert body["response_format"] == {"type": "json_object"}
    assert body["messages"][0] == {"role": "system", "content": SYSTEM_PROMPT}
    prompt = user_prompt(server)
    assert "Track: segmentation" in prompt and "Tier: standard" in prompt
    for item in RUBRIC.items:
        assert f"- {item.id} ({item.stage}): {item.text('segmentation')}" in prompt
    assert "Pilot on one case, check the mask" in prompt  # the plan
    assert "CUDA out of memory" in prompt and "exit_code=1" in prompt  # the trajectory
    assert "outputs present: 3, valid: 2, expected: 4" in prompt  # the format verdict
    assert "case_0004: missing" in prompt
    # The key went in the header, and the environment's secrets never in the prompt.
    assert "sk-judge-test-0123456789" not in json.dumps(body)


def test_fenced_json_is_accepted(server: FakeOpenAI, tmp_path: Path) -> None:
    server.push(TextReply("Here is my verdict:\n```json\n" + answer(ALL_IDS) + "\n```\n"))
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server))
    assert result.judge == f"llm:{MODEL}" and len(server.requests) == 1
    assert all(i.score == 1.0 for i in result.items)


def test_malformed_json_then_a_valid_answer_is_one_retry(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    server.push(TextReply('{"items": {"s1_plan_exists": {"answer": "yes"'))
    server.push(TextReply(answer(ALL_IDS, no=("s1_diagram",))))
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server))
    assert len(server.requests) == 2 and result.fallback_reason is None
    assert {i.id: i.score for i in result.items}["s1_diagram"] == 0.0
    retry = server.requests[1].body["messages"]
    assert retry[:2] == server.requests[0].body["messages"]
    assert "not valid JSON" in retry[-1]["content"]


def test_malformed_every_time_falls_back_to_the_rules(server: FakeOpenAI, tmp_path: Path) -> None:
    server.default = TextReply("{not json at all")
    ctx = make_ctx(tmp_path)
    result = judge_llm(ctx, EVENTS, REPORT, config(server, retries=2))
    assert len(server.requests) == 3
    assert result.fallback_reason is not None and "not valid JSON" in result.fallback_reason
    assert result.judge == f"rules (fallback from llm:{MODEL}: {result.fallback_reason})"
    assert result.items == judge_rules(ctx, EVENTS, RUBRIC)
    assert result.codes == [] and not result.cached


def test_a_refusal_is_retried_then_falls_back(server: FakeOpenAI, tmp_path: Path) -> None:
    server.default = TextReply("I'm sorry, but I can't help with grading this.")
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server, retries=1))
    assert len(server.requests) == 2
    assert result.fallback_reason is not None and "refused" in result.fallback_reason
    assert result.judge.startswith(f"rules (fallback from llm:{MODEL}: ")


def test_content_filter_is_a_refusal_even_with_json() -> None:
    with pytest.raises(UnusableAnswer, match="content_filter"):
        parse_answer(answer(ALL_IDS), "content_filter", ALL_IDS)


@pytest.mark.parametrize(
    ("bad", "why"),
    [
        (answer([i for i in ALL_IDS if i != "s2_environment"]), "items missing: s2_environment"),
        (answer(ALL_IDS).replace('"yes"', '"maybe"', 1), "is not yes or no"),
        (json.dumps({"verdict": "yes"}), '"items"'),
    ],
    ids=["missing_item", "not_yes_or_no", "no_items"],
)
def test_an_incomplete_answer_is_unusable(
    server: FakeOpenAI, tmp_path: Path, bad: str, why: str
) -> None:
    with pytest.raises(UnusableAnswer, match=why):
        parse_answer(bad, "stop", ALL_IDS)
    server.push(TextReply(bad), TextReply(answer(ALL_IDS)))
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server))
    assert len(server.requests) == 2 and result.judge == f"llm:{MODEL}"
    assert why in server.requests[1].body["messages"][-1]["content"]


def test_http_500_falls_back_without_retrying(server: FakeOpenAI, tmp_path: Path) -> None:
    server.default = ErrorReply(500, "the judge is down")
    ctx = make_ctx(tmp_path)
    result = judge_llm(ctx, EVENTS, REPORT, config(server))
    assert len(server.requests) == 1
    assert result.fallback_reason is not None and "500" in result.fallback_reason
    assert result.judge == f"rules (fallback from llm:{MODEL}: {result.fallback_reason})"
    assert result.items == judge_rules(ctx, EVENTS, RUBRIC)


def test_connection_refused_falls_back(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    monkeypatch.setenv("OPENAI_API_KEY", "sk-judge-test-0123456789")
    with socket.socket() as probe:  # a port that nothing listens on once closed
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    cfg = LlmJudgeConfig(model=MODEL, api_base=f"http://127.0.0.1:{port}/v1", timeout_s=5)
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, cfg)
    assert result.fallback_reason is not None and "Connection" in result.fallback_reason
    assert result.judge.startswith(f"rules (fallback from llm:{MODEL}: ")


def test_missing_key_falls_back_before_any_request(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    monkeypatch.delenv("OPENAI_API_KEY", raising=False)
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, LlmJudgeConfig(model=MODEL))
    assert result.fallback_reason is not None and "OPENAI_API_KEY" in result.fallback_reason


def test_votes_take_the_majority_per_item_and_error_codes(
    server: FakeOpenAI, tmp_path: Path
) -> None:
    e3 = {"code": "E3", "evidence": "pilot not checked", "seq": 4}
    server.push(
        TextReply(answer(ALL_IDS, no=("s3_pilot_checked",), codes=[e3], tag="v1 ")),
        TextReply(
            answer(
                ALL_IDS,
                no=("s3_pilot", "s3_pilot_checked", "s1_diagram"),
                codes=[{"code": "E3", "evidence": "other words"}, {"code": "E4", "evidence": "x"}],
                tag="v2 ",
            )
        ),
        TextReply(answer(ALL_IDS, no=("s1_diagram",), codes=[{"code": "E5"}], tag="v3 ")),
    )
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server, votes=3))
    assert len(server.requests) == 3
    by_id = {i.id: i for i in result.items}
    assert by_id["s3_pilot"].score == 1.0  # 2 yes, 1 no
    assert by_id["s3_pilot"].evidence == f"llm:{MODEL}: yes (2/3 votes)"
    assert by_id["s3_pilot"].rationale == "v1 why s3_pilot"
    assert by_id["s3_pilot_checked"].score == 0.0  # 1 yes, 2 no
    assert by_id["s3_pilot_checked"].rationale == "v1 why s3_pilot_checked"
    assert by_id["s1_diagram"].score == 0.0  # 1 yes, 2 no
    assert by_id["s1_diagram"].rationale == "v2 why s1_diagram"
    assert [(c.code, c.evidence, c.seq) for c in result.codes] == [("E3", "pilot not checked", 4)]


def test_a_tie_is_no_and_an_unusable_vote_is_retried(server: FakeOpenAI, tmp_path: Path) -> None:
    server.push(
        TextReply(answer(ALL_IDS)),
        TextReply("no JSON here"),
        TextReply(answer(ALL_IDS, no=("s2_environment",))),
    )
    result = judge_llm(make_ctx(tmp_path), EVENTS, REPORT, config(server, votes=2))
    assert len(server.requests) == 3
    by_id = {i.id: i for i in result.items}
    assert by_id["s2_environment"].score == 0.0
    assert by_id["s2_environment"].evidence == f"llm:{MODEL}: no (1/2 votes)"
    assert by_id["s2_sample_run"].score == 1.0


def test_lite_auto_pass_items_are_not_asked(server: FakeOpenAI, tmp_path: Path) -> None:
    asked = asked_ids("lite")
    assert LITE_AUTO and set(LITE_AUTO).isdisjoint(asked)
    server.push(TextReply(answer(asked)))
    ctx = make_ctx(tmp_path, tier="lite")
    result = judge_llm(ctx, EVENTS, REPORT, config(server))
    body = json.dumps(server.requests[0].body)
    for item_id in LITE_AUTO:
        assert item_id not in body
    rules = {i.id: i for i in judge_rules(ctx, EVENTS, RUBRIC)}
    for item in result.items:
        if item.id in LITE_AUTO:
            assert item == rules[item.id]
            assert item.auto and item.score == 1.0
        else:
            assert not item.auto and item.evidence == f"llm:{MODEL}: yes"
    assert result.judge == f"llm:{MODEL}"


def test_the_digest_keeps_every_failed_call_and_is_bounded(tmp_path: Path) -> None:
    noise = "x" * 20_000
    events = parse_events(
        [
            tool(
                seq,
                f"step {seq}\n" + noise,
                exit_code=1 if seq in (50, 150) else 0,
                stdout=noise,
                stderr=(f"FAILURE-AT-{seq}\n" + noise + f"\nTAIL-OF-{seq}")
                if seq in (50, 150)
                else noise,
            )
            for seq in range(200)
        ]
    )
    digest = digest_trajectory(events)
    assert "200 tool calls, 2 failed" in digest
    for seq in (50, 150):
        assert f"(seq {seq}, turn {seq // 2 + 1}, t={float(seq)}s) execute [FAILED]" in digest
        assert f"TAIL-OF-{seq}" in digest  # the tail of a clipped output is kept
        assert f"step {seq}\n" in digest  # and the head of the code
    assert "[... 40 successful calls omitted (calls 11-50) ...]" in digest
    assert "[... 99 successful calls omitted (calls 52-150) ...]" in digest
    assert "[... 39 successful calls omitted (calls 152-190) ...]" in digest
    assert "(seq 9," in digest and "(seq 10," not in digest  # the head
    assert "(seq 190," in digest and "(seq 189," not in digest  # the tail
    shown = DIGEST_HEAD_CALLS + DIGEST_TAIL_CALLS + 2
    assert len(digest) < shown * (sum(CALL_CHARS.values()) + 400)
    prompt = build_prompt(make_ctx(tmp_path), events, REPORT, RUBRIC)
    assert sum(len(m["content"]) for m in prompt) < 80_000


def test_plan_files_are_bounded_and_binaries_named_only(tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path, plan="# Plan\n" + "step\n" * 5000 + "END-OF-PLAN")
    (ctx.plan_dir / "plan.png").write_bytes(b"\x89PNG\r\n\x1a\n" + b"\0" * 100)
    (ctx.plan_dir / "plan.mmd").write_text("flowchart LR\n  load --> pilot --> batch\n")
    prompt = build_prompt(ctx, [], REPORT, RUBRIC)[1]["content"]
    plan = prompt.split("# Plan folder\n", 1)[1].split("# Trajectory digest", 1)[0]
    assert "END-OF-PLAN" not in plan and "truncated: the file has" in plan
    assert len(plan) < PLAN_FILE_CHARS + 1000
    assert "== plan.png: 108 bytes (binary, not shown) ==" in plan
    assert "load --> pilot --> batch" in plan
    assert "The agent made no tool calls." in prompt


def test_references_next_to_the_plan_are_never_sent(server: FakeOpenAI, tmp_path: Path) -> None:
    ctx = make_ctx(tmp_path)
    private = tmp_path / "workspace" / "private"
    private.mkdir()
    (private / "answers.json").write_text(json.dumps({"case_0001": CANARY}))
    # The agent plants links in its plan folder to the references beside it.
    (ctx.plan_dir / "notes.md").symlink_to(private / "answers.json")
    (ctx.plan_dir / "refs").symlink_to(private, target_is_directory=True)
    (ctx.plan_dir / "sub").mkdir()
    (ctx.plan_dir / "sub" / "deep.md").symlink_to(Path("../../private/answers.json"))
    server.default = TextReply(answer(ALL_IDS))
    result = judge_llm(ctx, EVENTS, REPORT, config(server))
    assert result.judge == f"llm:{MODEL}"
    # The whole plan folder is itself a link to the references.
    linked = dataclasses.replace(ctx, plan_dir=tmp_path / "workspace" / "plan2")
    linked.plan_dir.symlink_to(private, target_is_directory=True)
    judge_llm(linked, EVENTS, REPORT, config(server))
    assert len(server.requests) == 2
    for request in server.requests:
        assert CANARY not in json.dumps(request.body)
    prompt = user_prompt(server)
    assert "== notes.md: a symbolic link (not followed) ==" in prompt
    assert "== refs: a symbolic link (not followed) ==" in prompt
    assert "== sub/deep.md: a symbolic link (not followed) ==" in prompt
    assert "Compare nnU-Net" in prompt  # the plan itself is read
    assert "The plan folder is a symbolic link; it was not read." in user_prompt(server, 1)


def test_a_cache_hit_makes_no_request(server: FakeOpenAI, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    ctx = make_ctx(tmp_path)
    server.push(TextReply(answer(ALL_IDS, no=("s1_diagram",), codes=[{"code": "E5"}])))
    first = judge_llm(ctx, EVENTS, REPORT, config(server, cache_dir=cache))
    assert len(server.requests) == 1 and not first.cached
    assert len(list(cache.glob("*.json"))) == 1
    started = time.monotonic()
    second = judge_llm(ctx, EVENTS, REPORT, config(server, cache_dir=cache))
    assert time.monotonic() - started < 2
    assert len(server.requests) == 1 and second.cached
    assert (second.items, second.codes, second.judge, second.prompt_sha256) == (
        first.items,
        first.codes,
        first.judge,
        first.prompt_sha256,
    )
    # Other votes are another judgement: asked again.
    server.push(*[TextReply(answer(ALL_IDS))] * 3)
    judge_llm(ctx, EVENTS, REPORT, config(server, cache_dir=cache, votes=3))
    assert len(server.requests) == 4


def test_a_fallback_is_not_cached(server: FakeOpenAI, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    server.push(ErrorReply(503, "busy"))
    ctx = make_ctx(tmp_path)
    first = judge_llm(ctx, EVENTS, REPORT, config(server, cache_dir=cache))
    assert first.fallback_reason is not None and not list(cache.glob("*.json"))
    server.push(TextReply(answer(ALL_IDS)))
    second = judge_llm(ctx, EVENTS, REPORT, config(server, cache_dir=cache))
    assert len(server.requests) == 2 and second.judge == f"llm:{MODEL}" and not second.cached
