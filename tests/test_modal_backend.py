"""The Modal backend at the SDK boundary (tests/modal_fake.py, on real Docker), plus an opt-in real test."""

from __future__ import annotations

import asyncio
import os
import uuid

import pytest

pytest.importorskip("modal", reason="the Modal backend needs the modal extra: pip install 'hermes-batch[modal]'")

from hermes_batch.backends import ImageUnavailable, SandboxSpec, load_backend  # noqa: E402
from tests.backend_harness import TEST_IMAGE, docker_status, make_settings, unavailable  # noqa: E402
from tests.conftest import write_jsonl  # noqa: E402
from tests.modal_fake import fake_modal_module  # noqa: E402


@pytest.fixture
def fake(monkeypatch):
    why = docker_status()
    if why:
        unavailable("modal", f"its SDK-boundary tests run on Docker: {why}")
    import docker

    engine = docker.from_env()
    module = fake_modal_module(engine)
    monkeypatch.setattr("hermes_batch.backends.modal.modal", module)
    yield module
    engine.close()


def run(settings, body):
    async def main():
        backend = load_backend("modal", settings)
        await backend.setup()
        try:
            return await body(backend)
        finally:
            await backend.shutdown()

    return asyncio.run(main())


def test_sandboxes_carry_the_run_tags_and_a_crashed_runs_are_swept(fake, tmp_path):
    settings = make_settings(tmp_path)

    async def body(backend):
        left = [await backend.start(SandboxSpec(prompt_id=f"p{i}")) for i in range(2)]  # a "crash": never closed
        engine = fake.fake.engine
        labels = engine.api.inspect_container(left[0].sb.object_id)["Config"]["Labels"]
        swept = await backend.sweep_orphans()
        remaining = engine.api.containers(all=True, filters={"label": f"hermes-batch.run={settings.run_label}"})
        return labels, swept, remaining

    labels, swept, remaining = run(settings, body)
    assert labels["hermes-batch.run"] == settings.run_label and labels["hermes-batch.prompt-id"] == "p0"
    assert swept == 2 and remaining == []


def test_an_image_modal_cannot_build_fails_before_any_model_call(fake, tmp_path):
    async def body(backend):
        ok = await backend.prepare_image(TEST_IMAGE)
        with pytest.raises(ImageUnavailable, match="could not build image hermes-batch-absent:1"):
            await backend.prepare_image("hermes-batch-absent:1")
        return ok

    assert run(make_settings(tmp_path), body) == TEST_IMAGE


def test_limits_and_network_reach_the_sdk(fake, tmp_path):
    settings = make_settings(tmp_path, memory="300m", cpus=0.5)

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        try:
            return fake.fake.engine.api.inspect_container(sb.sb.object_id)["HostConfig"]
        finally:
            await sb.close()

    host = run(settings, body)
    assert host["Memory"] == 300 * 2**20 and host["NanoCpus"] == 5 * 10**8 and host["NetworkMode"] == "none"
    assert fake.fake.outbound == [None]  # no network at all: nothing to allow


def test_with_network_a_modal_sandbox_reaches_public_addresses_only(fake, tmp_path):
    """--network on Modal: Modal's own network (not this machine's), told to reach no private,
    loopback, shared or link-local (metadata) address."""
    import ipaddress

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id="p"))
        await sb.close()

    run(make_settings(tmp_path, network=True), body)
    [allowed] = fake.fake.outbound
    nets = [ipaddress.ip_network(c) for c in allowed]
    for internal in ("10.1.2.3", "127.0.0.1", "169.254.169.254", "172.17.0.1", "192.168.1.1", "100.64.0.1", "0.0.0.0"):
        assert not any(ipaddress.ip_address(internal) in n for n in nets), internal
    for public in ("1.1.1.1", "8.8.8.8", "9.9.9.9", "151.101.1.1", "223.255.255.1"):
        assert any(ipaddress.ip_address(public) in n for n in nets), public


def test_the_boundary_check_catches_a_wrong_call(fake):
    with pytest.raises(TypeError):
        fake.Sandbox.create.aio("sleep", "infinity", no_such_option=True)
    with pytest.raises(AssertionError, match="blocking"):
        fake.Sandbox.create("sleep")


def test_missing_credentials_are_a_clear_error(cli, tmp_path):
    data = write_jsonl(tmp_path / "d.jsonl", [{"prompt": "p"}])
    env = {"MODAL_SERVER_URL": "http://127.0.0.1:9", "HOME": str(tmp_path), "MODAL_TOKEN_ID": "", "MODAL_TOKEN_SECRET": ""}
    res = cli.run("nomodal", data, backend="modal", env=env)
    assert res.returncode == 1
    assert "Modal rejected the credentials" in res.stderr and "modal token new" in res.stderr


def test_against_real_modal():
    """Opt-in: HERMES_BATCH_MODAL_REAL=1 with Modal credentials configured."""
    if os.environ.get("HERMES_BATCH_MODAL_REAL") != "1":
        pytest.skip("Modal's cloud is not configured here: set HERMES_BATCH_MODAL_REAL=1 with a Modal token to run this")
    from hermes_batch.backends import BackendSettings

    async def body(backend):
        sb = await backend.start(SandboxSpec(prompt_id=f"real-{uuid.uuid4().hex[:6]}"))
        try:
            return await sb.exec("echo out; echo err >&2; exit 3", language="shell", timeout=60)
        finally:
            await sb.close()

    res = run(BackendSettings(run_label=f"real-{uuid.uuid4().hex[:6]}", image="python:3.12-slim"), body)
    assert (res.exit_code, res.stdout, res.stderr) == (3, "out\n", "err\n")

