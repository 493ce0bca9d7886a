"""The bring-up timeline: step marks in the scripts' stdout, read back from state and drawn."""

from __future__ import annotations

import json

from kimi_cluster.cli import timeline as timeline_cli
from kimi_cluster.operator import timeline_report
from tests.node.conftest import FAST, make_settings
from tests.node.test_steps_on_fake_node import ok


def marks(rank: int, step: str, start: str, end: str | None, rc: int = 0) -> str:
    out = f"[08:00:00] something\nKIMI-STEP rank={rank} step={step} start 2026-12-01T{start}Z\n"
    if end:
        out += f"more output\nKIMI-STEP rank={rank} step={step} end 2026-12-01T{end}Z rc={rc}\n"
    return out


def command(name: str, stdout: str) -> dict:
    return {"urn": f"urn:pulumi:dev::kimi-cluster::command:remote:Command::{name}", "type": "command:remote:Command",
            "outputs": {"stdout": stdout, "stderr": ""}}


DOC = [
    command("kimi-node0-ready", marks(0, "ready", "08:00:00.000", "08:00:30.500")),
    command("kimi-node0-weights", marks(0, "weights", "08:00:31.000", "08:07:00.000")),
    command("kimi-node0-image", marks(0, "image", "08:00:31.000", "08:03:00.000")),
    command("kimi-node1-ready", marks(1, "ready", "08:00:02.000", "08:00:40.000")),
    command("kimi-node1-weights", marks(1, "weights", "08:00:41.000", "08:06:00.000", rc=1)),
    {"urn": "urn:pulumi:dev::kimi-cluster::kimi:cluster:GpuNode::kimi-node0", "type": "kimi:cluster:GpuNode",
     "outputs": {}},
    # An encrypted value in an export carries no marks; it must not break the reader.
    {"urn": "x", "type": "command:remote:Command", "outputs": {"stdout": {"ciphertext": "v1:abc"}}},
]


def test_marks_are_read_from_an_export_and_from_the_sandbox_state_alike():
    export = {"version": 3, "deployment": {"resources": DOC}}
    sandbox = {"version": 1, "resources": DOC}
    for doc in (export, sandbox):
        bars = timeline_report.bars_from_state(doc)
        assert [(b.rank, b.step) for b in bars] == [(0, "ready"), (0, "weights"), (0, "image"), (1, "ready"),
                                                     (1, "weights")]
        assert bars[0].seconds == 30.5 and bars[-1].rc == 1


def test_a_step_without_its_end_mark_is_drawn_as_running():
    bars = timeline_report.bars_from_text(marks(2, "launch", "08:10:00.000", None))
    assert len(bars) == 1 and bars[0].end is None and "running" in timeline_report.table(bars)


def test_the_timeline_is_written_as_png_and_svg(tmp_path, capsys):
    state = tmp_path / "export.json"
    state.write_text(json.dumps({"deployment": {"resources": DOC}}))
    png, svg = tmp_path / "t.png", tmp_path / "t.svg"
    assert timeline_cli.main([str(state), "--out", str(png)]) == 0
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = capsys.readouterr().out
    assert "node1   weights" in out and "exit 1" in out and "first start to last end: 420.0 s" in out
    assert timeline_cli.main([str(state), "--out", str(svg)]) == 0
    assert "<svg" in svg.read_text()[:1000]


def test_no_marks_means_no_picture_and_a_clear_exit(tmp_path, capsys):
    state = tmp_path / "old.json"
    state.write_text(json.dumps({"resources": [command("n0-ready", "no marks here")]}))
    assert timeline_cli.main([str(state), "--out", str(tmp_path / "t.png")]) == 1
    assert not (tmp_path / "t.png").exists() and "no step marks found" in capsys.readouterr().out


def test_every_rendered_step_marks_its_start_and_end_with_its_rank(node):
    from kimi_cluster.blueprint import render_step

    settings = make_settings(nodeRoot=str(node.root))
    out = ok(node.run(render_step(settings, "storage", 2, "10.0.0.5", "10.0.0.4", FAST)))
    bars = timeline_report.bars_from_text(out)
    assert [(b.rank, b.step, b.rc) for b in bars] == [(2, "storage", 0)] and bars[0].seconds >= 0


def test_replicas_get_one_lane_group_each_and_the_front_its_own(tmp_path):
    doc = {"resources": [
        command("kimi-node0-launch", marks(0, "launch", "08:00:00.000", "08:00:10.000")),
        command("kimi-engine-ready", marks(0, "engine-ready", "08:00:10.000", "08:00:20.000")),
        command("kimi-r1-node0-launch", marks(0, "launch", "08:00:20.000", "08:00:30.000")),
        command("kimi-front-proxy", marks(0, "proxy", "08:00:01.000", "08:00:03.000")),
    ]}
    bars = timeline_report.bars_from_state(doc)
    assert [(b.label, b.step) for b in bars] == [("replica 0 node0", "launch"), ("replica 0 node0", "engine-ready"),
                                                 ("replica 1 node0", "launch"), ("front", "proxy")]
    out = tmp_path / "t.svg"
    timeline_report.draw(bars, str(out))
    assert "replica 1 node0" in out.read_text() and "front" in timeline_report.table(bars)


def test_the_bring_up_is_the_gpu_nodes_steps_and_a_later_caretaker_run_does_not_stretch_it():
    """The scheduler's lead before any scheduled up is this span: an up that changed only the schedule runs the
    caretaker's step again (on the front with replicas, on the head without), hours after the bring-up."""
    from kimi_cluster.plan.steps.table import NAMES

    assert timeline_report.NOT_BRINGUP_STEPS <= set(NAMES)
    later = [command("kimi-caretaker", marks(0, "caretaker", "15:00:00.000", "15:00:05.000")),
             command("kimi-front-proxy", marks(0, "proxy", "07:59:00.000", "09:00:00.000"))]
    assert timeline_report.bringup_seconds({"deployment": {"resources": DOC + later}}) == 420.0
    assert timeline_report.bringup_seconds({"deployment": {"resources": later}}) is None
