"""docker/: the compose file, the Dockerfiles and their build contexts agree, with no Docker needed.

What is checked (docs/deployment.md, "Docker"): every service's build context and Dockerfile
exist; every Dockerfile takes its base as ``ARG BASE_IMAGE`` (the official python image by default)
and every FROM uses it or an earlier stage; everything a Dockerfile copies or bind-mounts exists
and passes its per-Dockerfile .dockerignore; the two images share their dependency stage; images
are named lensemble-<role> and every image a service runs is built by some service; every host
path compose mounts is made by docker/prepare.sh and git-ignored; each site mounts what the
participant's entrypoint reads. Two optional tests use Docker when it is there: ``docker compose
config`` (or docker-compose v1) accepts the file, and (slow, opt-in with LENSEMBLE_DOCKER_BUILD=1,
several minutes and GBs; BASE_IMAGE=lensemble-base:local where no registry is reachable) both
images build and import torch, torchvision, flwr and lensemble.
"""

from __future__ import annotations

import fnmatch
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml

REPO = Path(__file__).resolve().parents[2]
DOCKER = REPO / "docker"
COMPOSE = DOCKER / "compose.yaml"
ROLES = ("coordinator", "participant")
SCRIPTS = ("build-base.sh", "build-images.sh", "fetch-wheels.sh", "prepare.sh", "run-demo.sh")


def _compose() -> dict:
    return yaml.safe_load(COMPOSE.read_text())


def _instructions(dockerfile: Path) -> list[tuple[str, str]]:
    """(INSTRUCTION, arguments) with continuation lines joined and comments dropped."""
    out: list[tuple[str, str]] = []
    buf = ""
    for raw in dockerfile.read_text().splitlines():
        line = raw.strip()
        if not buf and (not line or line.startswith("#")):
            continue
        if buf and line.startswith("#"):
            continue
        if line.endswith("\\"):
            buf += line[:-1] + " "
            continue
        buf += line
        word, _, rest = buf.partition(" ")
        out.append((word.upper(), rest.strip()))
        buf = ""
    return out


def _dockerignore(dockerfile: Path) -> list[str]:
    path = dockerfile.with_name(dockerfile.name + ".dockerignore")
    assert path.is_file(), f"{path.name} missing: without it BuildKit sends the whole checkout"
    return [ln.strip() for ln in path.read_text().splitlines() if ln.strip() and not ln.startswith("#")]


def _ignored(rel: str, patterns: list[str]) -> bool:
    """Docker's rule: the last matching pattern wins; a pattern also matches everything below it."""
    ignored = False
    for pat in patterns:
        neg = pat.startswith("!")
        p = pat[1:] if neg else pat
        p = p.rstrip("/")
        if p.startswith("**/"):
            hit = any(fnmatch.fnmatch(part, p[3:]) for part in rel.split("/"))
        else:
            parts = rel.split("/")
            hit = any(fnmatch.fnmatch("/".join(parts[:i]), p) for i in range(1, len(parts) + 1))
        if hit:
            ignored = not neg
    return ignored


def _services_with_build() -> dict[str, dict]:
    return {name: svc for name, svc in _compose()["services"].items() if "build" in svc}


def _bind_mounts() -> list[tuple[str, str, str]]:
    """(service, host path relative to docker/, container path) for every ./ bind mount."""
    out = []
    for name, svc in _compose()["services"].items():
        for vol in svc.get("volumes", []):
            src, dst = vol.split(":")[:2]
            if src.startswith("./"):
                out.append((name, src[2:], dst))
    return out


# --- the compose file ---------------------------------------------------------------------------

def test_compose_parses_and_names_the_two_sites_and_coordinator():
    services = _compose()["services"]
    assert {"coordinator", "register", "site0", "site1"} <= set(services)
    # docker-compose v1.29 (Debian bookworm's) rejects a top-level `name:`; the docs pass -p.
    assert set(_compose()) <= {"services", "volumes", "networks"} | {k for k in _compose() if k.startswith("x-")}


def test_every_build_context_and_dockerfile_exists():
    builds = _services_with_build()
    assert {Path(svc["build"]["dockerfile"]).name for svc in builds.values()} == {f"{r}.Dockerfile" for r in ROLES}
    for name, svc in builds.items():
        context = (DOCKER / svc["build"]["context"]).resolve()
        assert context == REPO, f"{name}: the build context is the repository root"
        assert (context / svc["build"]["dockerfile"]).is_file(), name


def test_images_named_consistently_and_every_run_image_is_built():
    built = {}
    for name, svc in _services_with_build().items():
        role = Path(svc["build"]["dockerfile"]).name.split(".")[0]
        assert svc["image"].split(":")[0] == f"lensemble-{role}", name
        built[svc["image"]] = role
    for name, svc in _compose()["services"].items():
        assert svc["image"] in built, f"{name} runs {svc['image']}, which no service builds"
    assert _compose()["services"]["register"]["image"] == _compose()["services"]["coordinator"]["image"]


def test_compose_passes_base_image_to_every_build():
    for name, svc in _services_with_build().items():
        args = svc["build"].get("args", {})
        assert "BASE_IMAGE" in args, name
        assert re.fullmatch(r"\$\{BASE_IMAGE:-python:3\.11-slim\}", args["BASE_IMAGE"]), args["BASE_IMAGE"]


def test_named_volumes_are_declared():
    declared = set(_compose().get("volumes") or {})
    for name, svc in _compose()["services"].items():
        for vol in svc.get("volumes", []):
            src = vol.split(":")[0]
            if not src.startswith(("./", "/", "~")):
                assert src in declared, f"{name}: volume {src} is not declared"


def test_every_mounted_host_path_is_made_by_prepare_and_git_ignored():
    prepare = (DOCKER / "prepare.sh").read_text()
    gitignore = [ln.strip() for ln in (REPO / ".gitignore").read_text().splitlines()]
    for service, rel, _dst in _bind_mounts():
        top = rel.split("/")[0]
        # prepare.sh's header lists what it makes as docker/<path>; the code writes "$D/<top>"
        assert f"docker/{top}/" in prepare and f'"$D/{top}' in prepare, f"{service}: {rel} is not made by prepare.sh"
        assert f"docker/{top}/" in gitignore, f"docker/{top}/ is not git-ignored (certs, keys or data)"
    mounted = {rel for _s, rel, _d in _bind_mounts()}
    assert {"certs", "keys", "certs/ca.crt", "keys/site0", "keys/site1", "data/site0", "data/site1"} <= mounted


def test_each_site_mounts_what_the_participant_entrypoint_reads():
    entry = " ".join(a for i, a in _instructions(DOCKER / "participant.Dockerfile") if i == "ENTRYPOINT")
    for path in ("/certs/ca.crt", "/keys/site", "/data", "/state"):
        assert path in entry
    for site in ("site0", "site1"):
        dsts = {v.split(":")[1] for v in _compose()["services"][site]["volumes"]}
        assert {"/certs/ca.crt", "/keys/site", "/data", "/state"} <= dsts, site
        env = _compose()["services"][site]["environment"]
        assert env["SUPERLINK"] == "coordinator:9092" and env["PARTITION_ID"] == site[-1]
    coord = {v.split(":")[1] for v in _compose()["services"]["coordinator"]["volumes"]}
    entry = " ".join(a for i, a in _instructions(DOCKER / "coordinator.Dockerfile") if i == "ENTRYPOINT")
    assert {"/certs", "/srv/lensemble"} <= coord
    for flag in ("--enable-supernode-auth", "--ssl-certfile", "--disable-runtime-dependency-installation"):
        assert flag in entry


# --- the Dockerfiles ----------------------------------------------------------------------------

@pytest.mark.parametrize("role", ROLES)
def test_dockerfile_takes_its_base_as_a_build_arg(role):
    ins = _instructions(DOCKER / f"{role}.Dockerfile")
    assert ins[0] == ("ARG", "BASE_IMAGE=python:3.11-slim"), "the first instruction declares the base"
    stages: list[str] = []
    for word, rest in ins:
        if word == "FROM":
            parts = rest.split()
            assert parts[0] == "${BASE_IMAGE}" or parts[0] in stages, f"FROM {parts[0]}: not the BASE_IMAGE arg"
            if len(parts) == 3 and parts[1].upper() == "AS":
                stages.append(parts[2])


@pytest.mark.parametrize("role", ROLES)
def test_everything_copied_exists_and_passes_the_dockerignore(role):
    dockerfile = DOCKER / f"{role}.Dockerfile"
    patterns = _dockerignore(dockerfile)
    sources = []
    for word, rest in _instructions(dockerfile):
        if word == "COPY" and "--from=" not in rest:
            sources += [s for s in rest.split()[:-1] if not s.startswith("--")]
        for m in re.finditer(r"--mount=type=bind,source=([^, ]+)", rest):
            sources.append(m.group(1))
    assert "docker/wheels" in sources, "the wheelhouse is bind-mounted into the install step"
    for src in sources:
        rel = src.rstrip("/")
        assert (REPO / rel).exists(), f"{role}: {src} is not in the repository"
        assert not _ignored(rel, patterns), f"{role}: {src} is excluded by its .dockerignore"
    # and the context stays small: no venv, no runs, no data, no tests
    for heavy in (".venv/bin/python", "runs/x", "data/x", "tests/unit/x.py", "docker/data/site0/x", "docker/keys/site0"):
        assert _ignored(heavy, patterns), f"{role}: {heavy} would be sent to the builder"


def test_both_images_share_the_dependency_stage():
    def shared(role):
        text = (DOCKER / f"{role}.Dockerfile").read_text()
        return text[text.index("ARG BASE_IMAGE"):text.index("ENV PATH=/opt/venv/bin")]
    assert shared("coordinator") == shared("participant")


def test_scripts_are_executable_and_parse():
    bash = shutil.which("bash")
    for name in SCRIPTS:
        path = DOCKER / name
        assert path.is_file() and os.access(path, os.X_OK), name
        if bash:
            subprocess.run([bash, "-n", str(path)], check=True)


def test_deployment_docs_describe_the_docker_path():
    text = (REPO / "docs" / "deployment.md").read_text()
    start = re.search(r"^## (\d+\. )?Docker\b", text, re.M)
    assert start, "docs/deployment.md has no Docker section"
    end = re.search(r"^## ", text[start.end():], re.M)
    section = text[start.start():start.end() + end.start()] if end else text[start.start():]
    for needle in ("BASE_IMAGE", "build-base.sh", "prepare.sh", "lensemble-base:local", "flwr run . compose"):
        assert needle in section, needle


# --- optional: with Docker ----------------------------------------------------------------------

def _compose_cli() -> list[str] | None:
    docker = shutil.which("docker")
    if docker and subprocess.run([docker, "compose", "version"], capture_output=True).returncode == 0:
        return [docker, "compose"]
    if shutil.which("docker-compose"):
        return [shutil.which("docker-compose")]
    return None


def _daemon_reachable() -> bool:
    docker = shutil.which("docker")
    return bool(docker) and subprocess.run([docker, "info"], capture_output=True, timeout=30).returncode == 0


def test_docker_compose_accepts_the_file():
    cli = _compose_cli()
    if cli is None:
        pytest.skip("no docker compose / docker-compose on this machine")
    res = subprocess.run([*cli, "-p", "lensemble", "-f", str(COMPOSE), "config"], capture_output=True, text=True)
    assert res.returncode == 0, res.stderr


@pytest.mark.slow
@pytest.mark.timeout(3600)
def test_images_build():
    if os.environ.get("LENSEMBLE_DOCKER_BUILD") != "1":
        pytest.skip("opt-in: LENSEMBLE_DOCKER_BUILD=1 (builds both images: minutes and several GB)")
    if not _daemon_reachable():
        pytest.skip("no reachable Docker daemon")
    env = {**os.environ, "TAG": "test"}
    res = subprocess.run([str(DOCKER / "build-images.sh")], env=env, capture_output=True, text=True)
    assert res.returncode == 0, res.stdout[-4000:] + res.stderr[-4000:]
    for role in ROLES:
        out = subprocess.run(["docker", "run", "--rm", "--entrypoint", "python3", f"lensemble-{role}:test", "-c",
                              "import torch, torchvision, flwr, lensemble; print(flwr.__version__)"],
                             capture_output=True, text=True)
        assert out.returncode == 0 and out.stdout.strip() == "1.42.0", out.stderr[-2000:]
