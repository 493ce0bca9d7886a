"""Careless and hostile input, fifth round (issue 52), the plan's side: step deadlines shorter than their step's own
work (an image pull, the front's render server, an engine's load and warm-up), and chat-layer flags the front's render
server cannot follow while streams resume. Each is refused before anything bills, naming the key, the step or flag,
and the floor."""

from __future__ import annotations

import json

import pytest

from kimi_cluster.blueprint.admission import admit, floor_minutes
from kimi_cluster.settings import SettingsError
from kimi_cluster.settings.loader import load_settings
from kimi_cluster.settings.work_model import IMAGE_BYTES, IMAGE_BYTES_PER_S, LOAD_S, READY_S, WARMUP_CACHED_S

KEY = "ssh-ed25519 AAAAC3NzaC1lZDI1NTE5AAAAIexampleexampleexample operator@laptop"
REPLICAS = {"topology": "b300x1-vllm", "replicas": 2}


def load(**raw):
    raw.setdefault("operatorCidr", "198.18.0.7/32")
    raw.setdefault("sshPublicKey", KEY)
    return admit(load_settings(raw, "dev"))


def deadlines(**minutes: float) -> str:
    return json.dumps(minutes)


REFUSED = [
    # A minute for a step that pulls a 16 GB image, on the GPU nodes or on the front, after every GPU VM bills.
    ({"stepDeadlineMinutes": deadlines(image=1)},
     "kimi-cluster:stepDeadlineMinutes: image: 1 minutes is shorter than the 5 its own work takes (pulling the ~16 GB "
     "engine image at 55 MB/s"),
    ({**REPLICAS, "stepDeadlineMinutes": deadlines(resume=1)},
     "kimi-cluster:stepDeadlineMinutes: resume: 1 minutes is shorter than the 6 its own work takes"),
    # The wait for an engine after a 1.5 TB load: cold kernels, or kept ones.
    ({"stepDeadlineMinutes": deadlines(readiness=1)}, "readiness: 1 minutes is shorter than the 14"),
    ({**REPLICAS, "stepDeadlineMinutes": deadlines(**{"engine-ready": 13.5})},
     "engine-ready: 13.5 minutes is shorter than the 14 its own work takes (loading the checkpoint to the GPUs"),
    ({"topology": "b300x1-vllm", "kernelWarmup": True, "stepDeadlineMinutes": deadlines(readiness=4)},
     "readiness: 4 minutes is shorter than the 5 its own work takes"),
    # Every problem is named at once.
    ({"stepDeadlineMinutes": deadlines(image=2, readiness=2)}, "image: 2 minutes"),
    ({"stepDeadlineMinutes": deadlines(image=2, readiness=2)}, "readiness: 2 minutes"),
    # The chat layer: what the front's render server cannot follow while streams resume.
    ({**REPLICAS, "extraEngineArgs": json.dumps(["--response-role", "bot"])},
     "kimi-cluster:extraEngineArgs sets --response-role ('--response-role bot'), which the front's render server "
     "cannot follow while streams resume"),
    ({**REPLICAS, "extraEngineArgs": json.dumps(["--allowed_local_media_path=/data"])},
     "kimi-cluster:extraEngineArgs sets --allowed-local-media-path"),
    ({**REPLICAS, "extraEngineArgs": json.dumps(["--enable-force-include"])},  # argparse's abbreviation
     "kimi-cluster:extraEngineArgs sets --enable-force-include-usage"),
]


@pytest.mark.parametrize(("raw", "needle"), REFUSED, ids=lambda v: str(v)[:60] if isinstance(v, str) else None)
def test_refused_naming_the_key_the_step_and_the_floor(raw, needle):
    with pytest.raises(SettingsError) as caught:
        load(**raw)
    text = str(caught.value)
    assert needle in text and "Traceback" not in text and len(text) < 3000, text


ACCEPTED = [
    {"stepDeadlineMinutes": deadlines(image=5, readiness=14, launch=1)},
    {**REPLICAS, "stepDeadlineMinutes": deadlines(resume=6, **{"engine-ready": 14}, readiness=1)},  # behind a front
    {"topology": "b300x1-vllm", "kernelWarmup": True, "stepDeadlineMinutes": deadlines(readiness=5)},
    {**REPLICAS, "resumeStreams": False, "extraEngineArgs": json.dumps(["--response-role", "bot"])},
    {"topology": "b300x1-vllm", "extraEngineArgs": json.dumps(["--return-tokens-as-token-ids"])},  # one replica
    {**REPLICAS, "extraEngineArgs": json.dumps(["--chat-template-content-format", "openai", "--max-logprobs", "5"])},
]


@pytest.mark.parametrize("raw", ACCEPTED)
def test_legitimate_values_are_accepted(raw):
    load(**raw)


def test_each_floor_is_the_plans_own_timing_model():
    plain = load_settings({"operatorCidr": "198.18.0.7/32", "sshPublicKey": KEY, "topology": "b300x1-vllm",
                           "kernelWarmup": True}, "dev")
    assert floor_minutes("image", plain) * 60 >= IMAGE_BYTES / IMAGE_BYTES_PER_S[0] > (floor_minutes("image", plain)
                                                                                      - 1) * 60
    assert floor_minutes("readiness", plain) * 60 >= LOAD_S[0] + WARMUP_CACHED_S[0] + READY_S[0]
    assert floor_minutes("launch", plain) == 0  # the one-minute floor of every step (the settings' own) holds
