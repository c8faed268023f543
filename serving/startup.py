"""Starting Serve on a busy machine: project-set proxy health checks, a bounded retry, a clear failure.

Ray Serve's defaults give the HTTP proxy 5 s to answer its readiness check, three times, then kill
it; beside a training or encoding job that keeps every core busy, a proxy actor can take longer
than that just to be scheduled, and `serve.start` dies with ActorDiedError. The proxy's checks are
read from environment variables by the Serve controller, so they are set for the driver (a local
Ray started here inherits them) and in the job's runtime_env (a controller started on a running
cluster gets them). Replica health checks are deployment options (serving.config.DeploymentResources).
"""
from __future__ import annotations

import logging
import os
import time
from dataclasses import dataclass
from typing import Callable, Dict, Optional

from edje.schemas.cli_options import option

log = logging.getLogger(__name__)


class ServeStartError(RuntimeError):
    """Serve did not come up healthy within the configured attempts; the message says what to do."""


@dataclass(frozen=True)
class StartupConfig:
    """How patiently Serve is started."""

    # Serve's default is 5 s. One flag sets both proxy timeouts (the second field shares it).
    proxy_ready_timeout_s: float = option(60.0, flag="--proxy-timeout", help="seconds Serve's HTTP proxy may take to "
                                          "answer a health check (Serve's own default: 5)")
    proxy_health_timeout_s: float = option(60.0, flag="--proxy-timeout")  # Serve's default is 10 s
    proxy_health_period_s: float = 20.0  # Serve's default is 10 s
    attempts: int = option(3, flag="--start-attempts", help="tries to bring Serve up before giving up")
    retry_wait_s: float = 5.0
    # serve.shutdown gives the controller 30 s and then returns with the controller still exiting.
    shutdown_wait_s: float = 120.0
    healthy_timeout_s: float = option(300.0, flag="--ready-timeout",
                                      help="seconds per attempt until a proxy is healthy and GET /healthz answers 200 "
                                      "(default %(default)s)")

    def __post_init__(self) -> None:
        if self.attempts < 1:
            raise ValueError(f"attempts must be >= 1, got {self.attempts}")
        if min(self.proxy_ready_timeout_s, self.proxy_health_timeout_s, self.proxy_health_period_s) <= 0:
            raise ValueError("proxy timeouts and period must be > 0")

    def env(self) -> Dict[str, str]:
        """The Serve controller's environment variables for the proxy's health checks."""
        return {"RAY_SERVE_PROXY_READY_CHECK_TIMEOUT_S": str(self.proxy_ready_timeout_s),
                "RAY_SERVE_PROXY_HEALTH_CHECK_TIMEOUT_S": str(self.proxy_health_timeout_s),
                "RAY_SERVE_PROXY_HEALTH_CHECK_PERIOD_S": str(self.proxy_health_period_s)}


def init_ray(address: str, startup: StartupConfig, env: Optional[Dict[str, str]] = None) -> None:
    """ray.init with the proxy settings in the driver's environment and the job's runtime_env."""
    import ray

    env_vars = {**(env or {}), **startup.env()}
    os.environ.update(env_vars)  # a local Ray started by this call inherits them
    ray.init(address=address, runtime_env={"env_vars": env_vars})


def wait_healthy(url: str, timeout_s: float) -> None:
    """Poll GET {url}/healthz until it answers 200; TimeoutError after timeout_s."""
    import requests

    deadline, last = time.time() + timeout_s, "no answer"
    while time.time() < deadline:
        try:
            r = requests.get(url + "/healthz", timeout=10)
            if r.status_code == 200:
                return
            last = f"HTTP {r.status_code}"
        except requests.RequestException as e:
            last = type(e).__name__
        time.sleep(1.0)
    raise TimeoutError(f"{url}/healthz did not answer 200 within {timeout_s:.0f} s (last: {last})")


def wait_proxy_healthy(timeout_s: float) -> None:
    """Poll Serve's status until an HTTP proxy reports HEALTHY; TimeoutError after timeout_s."""
    from ray import serve
    from ray.serve.schema import ProxyStatus

    deadline, proxies = time.time() + timeout_s, {}
    while time.time() < deadline:
        proxies = {node[:8]: status.value for node, status in serve.status().proxies.items()}
        if ProxyStatus.HEALTHY.value in proxies.values():
            return
        time.sleep(0.5)
    raise TimeoutError(f"no HTTP proxy reported healthy within {timeout_s:.0f} s (proxies: {proxies or 'none'})")


def wait_controller_gone(timeout_s: float) -> bool:
    """Poll until Serve's controller has left the cluster (its name is free); False after timeout_s or no answer."""
    import ray
    from ray.serve._private.constants import SERVE_CONTROLLER_NAME, SERVE_NAMESPACE

    deadline = time.time() + timeout_s
    while True:
        try:
            ray.get_actor(SERVE_CONTROLLER_NAME, namespace=SERVE_NAMESPACE)
        except ValueError:
            return True
        except Exception:  # the cluster did not answer: the next attempt reports its own error
            return False
        if time.time() >= deadline:
            return False
        time.sleep(0.5)


def start_serve(build: Callable[[], object], name: str, route_prefix: str, host: str, port: int, url: str,
                startup: StartupConfig) -> int:
    """serve.start, a healthy proxy, serve.run, /healthz: up to startup.attempts times; returns the attempts used."""
    from ray import serve

    errors = []
    for attempt in range(1, startup.attempts + 1):
        try:
            # http_options only take effect when Serve starts here; an already running Serve keeps its own.
            # A proxy on every node: Ray Train workers reach the miner on their own node's loopback.
            serve.start(proxy_location="EveryNode", http_options={"host": host, "port": port})
            # The replicas are deployed only behind a proxy that works: a proxy that cannot pass its checks
            # fails the attempt in seconds, before models are loaded for nothing.
            deadline = time.time() + startup.healthy_timeout_s
            wait_proxy_healthy(startup.healthy_timeout_s)
            serve.run(build(), name=name, route_prefix=route_prefix, blocking=False)
            wait_healthy(url, max(deadline - time.time(), 1.0))
            return attempt
        except Exception as e:
            if _is_config_error(e):
                raise
            errors.append(f"attempt {attempt}: {attempt_error(e)}")
            log.warning("Serve start-up %s", errors[-1])
            try:
                serve.shutdown()  # a half-started controller or proxy would answer the next attempt
            except Exception:
                pass
            if attempt < startup.attempts:
                # The next serve.start looks the controller up by name: a dying one would be reused and fail it.
                if not wait_controller_gone(startup.shutdown_wait_s):
                    log.warning("Serve's controller was still exiting %.0f s after serve.shutdown",
                                startup.shutdown_wait_s)
                time.sleep(startup.retry_wait_s * attempt)
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    raise ServeStartError(
        f"Ray Serve did not come up healthy in {startup.attempts} attempts "
        f"(proxy ready check {startup.proxy_ready_timeout_s:.0f} s, /healthz wait {startup.healthy_timeout_s:.0f} s). "
        f"Load average {load:.1f} on {os.cpu_count()} CPUs: other processes may hold every core. Free CPUs, or raise "
        f"--proxy-timeout / --start-attempts. Errors: " + " | ".join(errors))


def attempt_error(e: BaseException) -> str:
    """One line for a failed attempt: the error's type and first line, or, for the proxy that Serve's controller
    killed while serve.start waited on it, what that means."""
    from ray.exceptions import RayActorError

    text = str(e)
    # Ray names the dead actor's class only in the message: a proxy killed during serve.start failed the same
    # readiness checks that wait_proxy_healthy would have timed out on, only sooner.
    if isinstance(e, RayActorError) and "class_name: ProxyActor" in text:
        return (f"{type(e).__name__}: no HTTP proxy reported healthy: Serve's controller killed the proxy "
                "after it failed its readiness checks")
    return f"{type(e).__name__}: {text.splitlines()[0] if text else ''}"


def _is_config_error(e: BaseException) -> bool:
    """Errors that another attempt cannot fix (bad paths, mismatched tables, bad options)."""
    from edje.schemas.token_table import TableMismatchError

    return isinstance(e, (TableMismatchError, FileNotFoundError, ValueError, TypeError))
