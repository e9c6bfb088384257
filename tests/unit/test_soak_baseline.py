"""`wsmode soak`'s memory baseline (proxy/bench/soak.py): the warm-up runs the same load as
the soak, upstream kills included, so the baseline holds the footprint a kill's history
resends leave; a warm-up without them let a 50 x 120 soak fail its memory check on its
first kill (+16.2 MiB, then flat). What the summary counts is the soak's own. No process:
the stack and the conversations are stand-ins."""

from __future__ import annotations

import asyncio
from typing import Any

import pytest
from wsmode.bench import soak


class FakeStack:
    def __init__(self) -> None:
        self.proxy = type("P", (), {"pid": 1})()
        self.base = "http://fake"

    async def start(self) -> None:
        pass

    def stop(self) -> int:
        return 0


def test_the_warm_up_kills_the_upstream_as_the_soak_does(monkeypatch: pytest.MonkeyPatch) -> None:
    phases: list[str] = []  # what each conversation ran alongside: a killer or none
    kills: list[int] = []
    completed = [0.0]

    async def killer(self: soak.Runner, convs: list[soak.Conversation]) -> None:
        kills.append(len(convs))
        self.kills += 1
        await asyncio.Event().wait()  # cancelled once the conversations are done

    async def conversation(self: soak.Runner, conv: soak.Conversation, turns: int) -> None:
        await asyncio.sleep(0)
        phases.append(f"kills {len(kills)}")
        conv.completed_turns = turns
        completed[0] += turns

    async def metrics(base: str) -> dict[str, Any]:
        return {'wsmode_responses_total{dialect="responses",outcome="completed"}': completed[0]}

    monkeypatch.setattr(soak, "Stack", FakeStack)
    monkeypatch.setattr(soak.Runner, "killer", killer)
    monkeypatch.setattr(soak.Runner, "conversation", conversation)
    monkeypatch.setattr(soak, "_metrics", metrics)
    monkeypatch.setattr(soak, "_rss_kib", lambda pid: 1024)
    cfg = soak.SoakConfig(connections=2, turns=3, upstream_kills=1)
    passed, failed, lines = asyncio.run(soak.run(cfg))
    assert (passed, failed) == (cfg.connections + 3, 0), lines
    assert kills == [2, 2]  # the warm-up's conversations, then the soak's
    assert phases == ["kills 1"] * 2 + ["kills 2"] * 2
    summary = next(line for line in lines if "upstream kills" in line)
    assert "6 responses completed" in summary and "1 upstream kills" in summary, summary
