"""How a failed Serve start-up attempt is reported (serving.startup.attempt_error): one line each, and the proxy that
Serve's controller killed while serve.start waited on it reported as the readiness failure it is."""
from ray.core.generated.common_pb2 import ActorDiedErrorContext
from ray.exceptions import ActorDiedError

from edje.serving.startup import attempt_error


def _died(class_name: str) -> ActorDiedError:
    """The error Ray raises for an actor killed before it ran, as serve.start sees it for its proxy."""
    return ActorDiedError(ActorDiedErrorContext(
        class_name=class_name, actor_id=bytes(16), never_started=True,
        error_message="The actor is dead because it was killed by `ray.kill`."))


def test_a_proxy_killed_during_serve_start_reads_as_a_failed_readiness_check():
    # Under load the controller's checks can kill the proxy before serve.start's own wait resolves: the same
    # cause as wait_proxy_healthy's timeout, so the same words, with what happened.
    line = attempt_error(_died("ProxyActor"))
    assert line.startswith("ActorDiedError: no HTTP proxy reported healthy")
    assert "killed the proxy" in line and "\n" not in line


def test_other_errors_keep_their_type_and_first_line():
    assert attempt_error(_died("ServeController")) == f"ActorDiedError: {ActorDiedError.BASE_ERROR_MSG}"
    assert attempt_error(TimeoutError("no HTTP proxy reported healthy within 1 s\nmore")) == (
        "TimeoutError: no HTTP proxy reported healthy within 1 s")
    assert attempt_error(RuntimeError()) == "RuntimeError: "
