"""One ``perseus-train`` run on this node: checks, config file, server, ranks, report.

Order: check that the framework can run the configuration; write the resolved configuration into
the run directory (every rank reads it through env ``PERSEUS_CONFIG``); start the coordination
server when the run is online and no ``server.url`` is configured; run the ranks; fetch the job
summary; stop the server (always, also on failure or Ctrl-C); then write ``report.json`` and the
plots.
"""

from __future__ import annotations

import copy
import hashlib
import json
import logging
import shutil
import uuid
from contextlib import contextmanager
from pathlib import Path
from typing import Any, Dict, Iterator, Optional

from perseus.config.schema import PerseusConfig, RuntimeMode
from perseus.errors import ConfigError
from perseus.formats.plan import outputs as plan_outputs
from perseus.launcher import nodes
from perseus.launcher.nodes import Nodes
from perseus.launcher.preflight import check_job
from perseus.launcher.rank_processes import launch_ranks, plan_launch
from perseus.launcher.report import (
    apply_power_limit,
    report_from_steps,
    report_from_summary,
    write_report,
)
from perseus.runtime.launch import slurm

logger = logging.getLogger(__name__)

CONFIG_FILE = "perseus-config.yaml"
SERVER_FILES = (
    plan_outputs.PROFILE_CSV,
    plan_outputs.FRONTIER_CSV,
    plan_outputs.PLAN_JSON,
    plan_outputs.SUMMARY_JSON,
)


def new_job_id(nodes: Optional[Nodes] = None) -> str:
    """A job id (the server accepts ``[A-Za-z0-9_-]{1,64}``), with Slurm's job id when there is one.

    Random on one node (``train-<random>``, in Slurm ``slurm-<job>-<random>``); on several nodes
    every node must agree without talking, so it is derived from the rendezvous (address,
    port, node count) and the Slurm job step.
    """
    label = slurm.job_label()
    base = f"slurm-{label}" if label else "train"
    if nodes is not None and nodes.nnodes > 1:
        step = nodes.slurm.step_id if nodes.slurm else ""
        seed = f"{nodes.master_addr}:{nodes.master_port}:{nodes.nnodes}:{label}:{step}"
        return f"{base}-{hashlib.sha256(seed.encode()).hexdigest()[:12]}"
    return f"{base}-{uuid.uuid4().hex[:12]}"


def prepare_config(
    cfg: PerseusConfig, out_dir: Path, nodes: Optional[Nodes] = None
) -> PerseusConfig:
    """The configuration the ranks get: run directory, job id, framework-specific modes."""
    cfg = copy.deepcopy(cfg)
    cfg.output_dir = str(out_dir)
    if cfg.energy.policy == "power_limit":
        # The power-limit optimizer drives the GPU itself; the hooks only measure.
        cfg.runtime.mode = RuntimeMode.measure
    if not cfg.server.job_id:
        cfg.server.job_id = new_job_id(nodes)
    return cfg


def write_config(cfg: PerseusConfig, out_dir: Path, node_rank: int = 0) -> Path:
    """Write ``cfg`` as YAML (fully resolved) for the ranks.

    One file per node: the nodes of a Slurm job share the run directory.
    """
    from omegaconf import OmegaConf

    name = CONFIG_FILE if node_rank == 0 else CONFIG_FILE.replace(".yaml", f"-node{node_rank}.yaml")
    path = out_dir / name
    path.write_text(OmegaConf.to_yaml(OmegaConf.structured(cfg), resolve=True))
    return path


def needs_local_server(cfg: PerseusConfig, nnodes: int = 1) -> bool:
    """True when this node must start the coordination server."""
    if cfg.runtime.mode != "online" or cfg.server.url:
        return False
    if nnodes > 1:
        raise ConfigError(
            f"train.nnodes={nnodes} with runtime.mode=online needs a shared "
            "coordination server: start `perseus-server server.host=0.0.0.0 server.token=...` "
            "on one node and pass server.url=http://<host>:<port> (and server.token) to every node "
            "(under Slurm, examples/slurm/perseus_train.sbatch does this)"
        )
    return True


@contextmanager
def coordination_server(
    cfg: PerseusConfig, out_dir: Path, nnodes: int = 1
) -> Iterator[Optional[Any]]:
    """Start (and finally stop) the local server when needed; sets ``cfg.server.url``."""
    if not needs_local_server(cfg, nnodes):
        yield None
        return
    from perseus.server.process import start_local_server

    handle = start_local_server(cfg.server, out_dir / "server")
    cfg.server.url = handle.url
    how = (
        f"server.port={cfg.server.port}"
        if cfg.server.port
        else "a free port: server.port unset; set it to choose one"
    )
    logger.info("coordination server at %s (%s)", handle.url, how)
    try:
        yield handle
    finally:
        handle.stop()


def run_job(cfg: PerseusConfig, out_dir: Path) -> Dict[str, Any]:
    """Run the whole job on this node; returns the report (written on node rank 0)."""
    out_dir.mkdir(parents=True, exist_ok=True)
    place = nodes.resolve(cfg)
    cfg = prepare_config(cfg, out_dir, place)
    job_id = str(cfg.server.job_id)
    launch = plan_launch(cfg, run_id=job_id, nodes=place)
    nodes.check_slurm_gpus(cfg, place, launch.nproc_per_node)
    nodes.check_port_free(place)
    check_job(cfg, launch.nproc_per_node)
    summary: Optional[Dict[str, Any]] = None
    with coordination_server(cfg, out_dir, place.nnodes):
        config_path = write_config(cfg, out_dir, place.node_rank)
        logger.info(
            "job %s: starting %d rank(s), %s; rendezvous %s:%d (%s); run dir %s",
            job_id,
            launch.nproc_per_node,
            place.origin,
            launch.master_addr,
            launch.master_port,
            place.rendezvous,
            out_dir,
        )
        launch_ranks(launch, config_path, out_dir / "logs")
        if cfg.runtime.mode == "online" and cfg.server.url:
            summary = _fetch_summary(cfg, job_id)
        if summary:
            _copy_server_files(summary.get("files") or {}, out_dir)
    if place.node_rank != 0:
        return {}
    report = report_from_summary(summary) if summary else report_from_steps(cfg, out_dir)
    report["job"] = {"model": cfg.model.name, "framework": cfg.framework.name}
    power_limit = out_dir / "power_limit.json"
    if power_limit.is_file():
        apply_power_limit(report, json.loads(power_limit.read_text()))
    write_report(report, out_dir)
    from perseus.launcher.plots import write_plots

    write_plots(cfg, out_dir)
    return report


def _fetch_summary(cfg: PerseusConfig, job_id: str) -> Optional[Dict[str, Any]]:
    from perseus.errors import ServerError
    from perseus.runtime.online.client import ServerClient

    assert cfg.server.url is not None
    client = ServerClient(
        cfg.server.url,
        token=cfg.server.token,
        timeout_s=cfg.server.request_timeout_s,
        max_retries=cfg.server.max_retries,
    )
    try:
        summary = client.get(f"/jobs/{job_id}/summary")
    except ServerError as exc:
        logger.warning("no job summary from %s: %s", cfg.server.url, exc)
        return None
    return summary if isinstance(summary, dict) else None


def _copy_server_files(files: Dict[str, Any], out_dir: Path) -> None:
    """Copy the server's per-job files (profile, frontier, plans) into the run directory."""
    for name, value in files.items():
        src = Path(str(value))
        if src.parent == out_dir or not src.exists():
            continue
        if src.is_dir():
            shutil.copytree(src, out_dir / src.name, dirs_exist_ok=True)
        elif name in SERVER_FILES or src.name in SERVER_FILES:
            shutil.copy2(src, out_dir / src.name)
