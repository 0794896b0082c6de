"""Which backends the conformance suite can run here, and how to build each for a test."""

from __future__ import annotations

import os
import uuid
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import pytest

from hermes_batch.backends import BackendSettings, load_backend

TEST_IMAGE = os.environ.get("HERMES_BATCH_TEST_IMAGE", "hermes-batch-sandbox:bookworm")
REQUIRED = {b.strip() for b in os.environ.get("HERMES_BATCH_REQUIRE_BACKENDS", "").split(",") if b.strip()}


def unavailable(backend: str, why: str):
    """Skip, unless CI said this backend must be tested (then the missing engine is a failure)."""
    if backend in REQUIRED:
        pytest.fail(f"backend {backend!r} is required here (HERMES_BATCH_REQUIRE_BACKENDS) but unavailable: {why}")
    pytest.skip(f"{backend} backend unavailable: {why}")


def docker_status() -> str | None:
    """None when Docker and the test image are usable, else why not."""
    try:
        import docker
    except ImportError:
        return "the docker SDK is not installed (pip install 'hermes-batch[docker]')"
    try:
        client = docker.from_env(timeout=10)
        client.ping()
    except Exception as exc:
        return f"no Docker engine answers ({exc})"
    try:
        client.images.get(TEST_IMAGE)
    except Exception:
        return f"test image {TEST_IMAGE} is missing (build it with scripts/build_sandbox_image.sh)"
    finally:
        client.close()
    return None


@dataclass
class BackendUnderTest:
    name: str
    settings: BackendSettings
    image: str | None
    cleanup: Callable[[], None] = lambda: None
    double: Any = None  # the Flame double, when the backend is Flame

    def make(self):
        return load_backend(self.name, self.settings)


def make_settings(tmp_path, **extra) -> BackendSettings:
    label = f"conformance-{uuid.uuid4().hex[:8]}"
    return BackendSettings(run_label=label, sandbox_root=str(tmp_path / "sandboxes"), image=TEST_IMAGE, **extra)


def make_backend_under_test(name: str, tmp_path, extra: dict[str, Any] | None = None) -> BackendUnderTest:
    settings = make_settings(tmp_path, **(extra or {}))
    if name == "local":
        return BackendUnderTest("local", settings, None)
    if name == "local-unisolated":
        settings.local_isolation = "none"
        return BackendUnderTest("local", settings, None)
    if name == "docker":
        why = docker_status()
        if why:
            unavailable("docker", why)
        return BackendUnderTest("docker", settings, TEST_IMAGE)
    if name in ("docker-image-root", "docker-gvisor-image-root"):  # the image's root keeps its capabilities (Harbor's way)
        why = docker_status() or (gvisor_status() if "gvisor" in name else None)
        if why:
            unavailable("docker-gvisor" if "gvisor" in name else "docker", why)
        settings.image_root = "always"
        settings.runtime = GVISOR_RUNTIME if "gvisor" in name else None
        return BackendUnderTest("docker", settings, TEST_IMAGE)
    if name == "docker-gvisor":
        why = docker_status() or gvisor_status()
        if why:
            unavailable("docker-gvisor", why)
        settings.runtime = GVISOR_RUNTIME
        return BackendUnderTest("docker", settings, TEST_IMAGE)
    if name == "singularity":
        why = apptainer_status()
        if why:
            unavailable("singularity", why)
        settings.image = TEST_SIF
        return BackendUnderTest("singularity", settings, TEST_SIF)
    raise ValueError(name)


def any_backend_under_test(name: str, request, tmp_path) -> BackendUnderTest:
    """Any backend the suites name, the SDK shims (Modal) and doubles (Flame) included."""
    if name == "flame":
        from tests.flame_double import flame_backend_under_test

        return flame_backend_under_test(request, tmp_path)
    if name == "modal":
        from tests.modal_fake import modal_backend_under_test

        return modal_backend_under_test(request, tmp_path)
    return make_backend_under_test(name, tmp_path)


# the protocol holds everywhere, the unisolated local mode included (tests/test_adversarial.py holds
# the isolation properties, which that mode does not claim)
ALL_BACKENDS = ["local", "local-unisolated", "docker", "docker-image-root", "docker-gvisor", "singularity", "modal",
                "flame"]


def each_backend(names: list[str]):
    """A fixture giving each named backend in turn, cleaned up after the test."""

    @pytest.fixture(params=names)
    def backend(request, tmp_path):
        but = any_backend_under_test(request.param, request, tmp_path)
        yield but
        but.cleanup()

    return backend


TEST_SIF = os.environ.get("HERMES_BATCH_TEST_SIF", "/var/tmp/hermes-batch-images/sandbox.sif")


def apptainer_status() -> str | None:
    """None when apptainer runs here and the test SIF exists, else why not."""
    import shutil
    import subprocess

    exe = os.environ.get("HERMES_BATCH_APPTAINER") or shutil.which("apptainer") or shutil.which("singularity")
    if not exe:
        return "apptainer is not installed (scripts/setup_apptainer.sh installs one)"
    try:
        subprocess.run([exe, "--version"], check=True, capture_output=True, timeout=30)
    except (OSError, subprocess.SubprocessError) as exc:
        return f"{exe} does not run: {exc}"
    if not os.path.exists(TEST_SIF):
        return f"test image {TEST_SIF} is missing (scripts/setup_apptainer.sh builds it)"
    return None


GVISOR_RUNTIME = os.environ.get("HERMES_BATCH_GVISOR_RUNTIME", "runsc-nonet")


def gvisor_status() -> str | None:
    import docker

    client = docker.from_env(timeout=10)
    try:
        runtimes = client.info().get("Runtimes", {})
    finally:
        client.close()
    if GVISOR_RUNTIME not in runtimes:
        return (f"Docker has no {GVISOR_RUNTIME!r} runtime (install runsc and add it to /etc/docker/daemon.json "
                "with runtimeArgs [\"--network=none\"], as .ci/run does)")
    return None


def run_episodes(but: BackendUnderTest, base_url: str, dataset_path, image: str | None = None, **settings: Any) -> list:
    """Every row of a dataset as one prompt on this backend, all at once, through the real episode
    (sandbox, agent against the model at `base_url`, checks); how each settled."""
    import asyncio

    from hermes_batch.config import RunConfig
    from hermes_batch.dataset.rows import load_dataset
    from hermes_batch.episode.run import Host, run_episode
    from hermes_batch.episode.wire import WorkItem
    from hermes_batch.llm import open_client
    from hermes_batch.util.limits import AdaptiveLimit

    dataset = load_dataset(dataset_path)
    config = RunConfig(run_name="episodes", model="scripted", base_url=base_url, backend=but.name,
                       require_reasoning=False, **{"check_timeout": 60, **settings})
    at_once = max(1, len(dataset))

    async def main():
        guard = None
        if config.sandbox.network:  # as a worker does: the guard is each sandbox's one way out
            from hermes_batch.tools.guard_proxy import GuardProxy

            but.settings.network = True
            guard = GuardProxy()
        backend = but.make()
        backend.egress = guard
        await backend.setup()
        llm = open_client(config.model_settings(), "k", AdaptiveLimit(at_once))
        host = Host(0, config, backend, llm, asyncio.Semaphore(at_once), {}, "You are a test.", [], False)
        try:
            items = [WorkItem(id=r.id, index=r.index, prompt=r.prompt, toolsets=["terminal"], batch_num=0,
                              image=image or but.image, cwd=r.sandbox_cwd, task=r.task) for r in dataset.records]
            return await asyncio.gather(*(run_episode(host, item) for item in items))
        finally:
            await llm.close()
            await backend.shutdown()
            if guard is not None:
                await guard.close()

    return asyncio.run(main())
