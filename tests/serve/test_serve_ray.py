"""The HTTP API on a local Ray Serve instance: two program replicas, routing by program, a killed replica."""

from __future__ import annotations

import threading
import time
from collections.abc import Iterator

import httpx
import pytest
from pydantic import SecretStr

from pawfn import PawConfig, PawFn, Qwen3_0_6B, Remote, RuntimeOptions, Torch
from pawfn.core.protocol import RunBatchResponse, RunResponse, ServedProgram
from pawfn.serve import ServeSettings
from tests.helpers.programs import TinyProgram
from tests.helpers.servers import AUTH, FIRST_ID, INPUTS, KEY, SECOND_ID, free_port, run_concurrently, sse_events
from tests.helpers.tiny_models import TinyInterpreter

ray = pytest.importorskip("ray", reason="the Ray Serve deployment needs the ray extra")
serve = pytest.importorskip("ray.serve")

LocalRuns = dict[str, PawFn[Qwen3_0_6B, Torch]]
NAMES = {FIRST_ID: "tiny-first", SECOND_ID: "tiny-second"}


@pytest.fixture(scope="module")
def ray_url(served_programs: tuple[TinyProgram, TinyProgram], qwen3: TinyInterpreter, tmp_path_factory: pytest.TempPathFactory) -> Iterator[str]:
    from pawfn.serve.ray import RayAppArgs, ray_app

    first, second = served_programs
    ray.init(num_cpus=4, include_dashboard=False, object_store_memory=128 * 1024 * 1024, log_to_driver=False)
    port = free_port()
    serve.start(http_options={"host": "127.0.0.1", "port": port})
    args = RayAppArgs(
        # tiny-third (the first program again, under a name of its own) is asked for by the routing test alone
        programs=[f"tiny-first={first.archive}", f"tiny-second={second.archive}", f"tiny-third={first.archive}"],
        base=str(qwen3.hf_dir),
        replicas=2,
        max_programs_per_replica=3,
        config=PawConfig.from_env(cache_dir=tmp_path_factory.mktemp("ray-cache")),
        settings=ServeSettings(api_key=SecretStr(KEY), max_tokens=24, max_queue=64, max_queue_per_client=64),  # its callers share one address
    )
    serve.run(ray_app(args), name="pawfn", route_prefix="/")
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        try:
            if httpx.get(f"{url}/healthz", timeout=5).status_code == 200:
                break
        except httpx.TransportError:
            time.sleep(0.2)
    yield url
    serve.shutdown()
    ray.shutdown()


def _post(url: str, path: str, body: object) -> httpx.Response:
    return httpx.post(url + path, json=body, headers=AUTH, timeout=120)


def test_concurrent_requests_by_name_and_id_equal_local_runs(ray_url: str, local_runs: LocalRuns) -> None:
    calls = [(reference, text) for text in INPUTS for reference in (*NAMES.values(), FIRST_ID, SECOND_ID)]
    results = run_concurrently(ray_url, calls, max_tokens=10)
    by_name = {name: program_id for program_id, name in NAMES.items()}
    for (reference, text), result in zip(calls, results, strict=True):
        program_id = by_name.get(reference, reference)
        assert result.generation.token_ids == local_runs[program_id].generate(text, RuntimeOptions(max_tokens=10)).token_ids

    batch = _post(ray_url, f"/v1/programs/{FIRST_ID}/run_batch", {"inputs": INPUTS, "options": {"max_tokens": 8}})
    expected = local_runs[FIRST_ID].generate_batch(INPUTS, RuntimeOptions(max_tokens=8))
    assert [g.token_ids for g in RunBatchResponse.model_validate_json(batch.content).generations] == [g.token_ids for g in expected]
    infer = _post(ray_url, "/api/v1/infer", {"program_id": "tiny-second", "input": INPUTS[0], "max_tokens": 8})
    assert infer.json()["output"] == local_runs[SECOND_ID].run_with(INPUTS[0], RuntimeOptions(max_tokens=8))


def test_streaming_and_the_remote_backend_work_on_ray_too(ray_url: str, local_runs: LocalRuns) -> None:
    options = RuntimeOptions(max_tokens=12)
    with httpx.stream(
        "POST", f"{ray_url}/v1/programs/tiny-first/stream", json={"input": INPUTS[2], "options": {"max_tokens": 12}}, headers=AUTH, timeout=60
    ) as response:
        events = list(sse_events(response.iter_lines()))
    assert events[-1][0] == "done"
    assert RunResponse.model_validate(events[-1][1]).generation.token_ids == local_runs[FIRST_ID].generate(INPUTS[2], options).token_ids
    config = PawConfig.from_env(server_url=ray_url, server_api_key=KEY, max_retries=0)
    with PawFn[Qwen3_0_6B, Remote].load_sync("tiny-second", config=config) as remote:
        assert remote.run_batch(INPUTS, options) == local_runs[SECOND_ID].run_batch(INPUTS, options)


def test_the_openai_routes_work_on_ray_too(ray_url: str, local_runs: LocalRuns) -> None:
    import openai

    client = openai.OpenAI(base_url=f"{ray_url}/v1", api_key=KEY, max_retries=0)
    assert {"tiny-first", "tiny-second"} <= {model.id for model in client.models.list()}
    expected = local_runs[SECOND_ID].run_with(INPUTS[0], RuntimeOptions(max_tokens=10))
    chat = client.chat.completions.create(model="tiny-second", max_tokens=10, messages=[{"role": "user", "content": INPUTS[0]}])
    assert chat.choices[0].message.content == expected
    with client.completions.create(model="tiny-second", prompt=INPUTS[0], max_tokens=10, stream=True) as stream:
        assert "".join(chunk.choices[0].text for chunk in stream if chunk.choices) == expected
    with pytest.raises(openai.NotFoundError):
        client.completions.create(model="c3c3c3c3c3c3c3c3c3c3", prompt="x")


def test_a_programs_requests_go_to_the_replica_that_holds_it(ray_url: str) -> None:
    """A program no replica holds yet, asked for one request at a time: loaded once, then always that replica (the
    other programs may be on both replicas by now: concurrent calls spread them)."""
    assert httpx.get(f"{ray_url}/healthz").json()["programs"] == 3  # the programs named at start
    replicas = {
        ServedProgram.model_validate_json(httpx.get(f"{ray_url}/v1/programs/tiny-third", headers=AUTH, timeout=60).content).replica for _ in range(8)
    }
    assert len(replicas) == 1 and next(iter(replicas)), replicas


def test_a_killed_replicas_calls_are_retried_or_fail_clearly(ray_url: str, local_runs: LocalRuns) -> None:
    """Every program replica is killed under four callers: each answer is the local tokens (retried on a replica
    back up) or 503 replica_failed. All of them, since earlier tests may have loaded tiny-first on both replicas
    and routing may send every call to the one a single kill spares (then the test saw nothing)."""
    holder = ServedProgram.model_validate_json(httpx.get(f"{ray_url}/v1/programs/tiny-first", headers=AUTH).content).replica
    assert holder is not None
    deployment = holder.rsplit("#", 1)[0]
    replicas = [
        actor["name"]
        for actor in ray.util.list_named_actors(all_namespaces=True)
        if actor["namespace"] == "serve" and actor["name"].rsplit("#", 1)[0] == deployment
    ]
    assert holder in replicas and len(replicas) == 2, replicas
    expected = [g.token_ids for g in local_runs[FIRST_ID].generate_batch(INPUTS, RuntimeOptions(max_tokens=24))]
    answers: list[httpx.Response] = []
    stop = threading.Event()

    def keep_calling() -> None:
        while not stop.is_set():
            answers.append(_post(ray_url, "/v1/programs/tiny-first/run_batch", {"inputs": INPUTS, "options": {"max_tokens": 24}}))

    callers = [threading.Thread(target=keep_calling) for _ in range(4)]
    for caller in callers:
        caller.start()
    time.sleep(1.0)
    for replica in replicas:
        ray.kill(ray.get_actor(replica, namespace="serve"), no_restart=False)
    time.sleep(2.0)
    stop.set()
    for caller in callers:
        caller.join()
    assert answers
    for answer in answers:
        if answer.status_code == 200:
            assert [g.token_ids for g in RunBatchResponse.model_validate_json(answer.content).generations] == expected
        else:
            assert (answer.status_code, answer.json()["error"]) == (503, "replica_failed"), answer.text
            assert "retry" in answer.json()["message"]
    deadline = time.monotonic() + 120  # the replicas restart and load their programs again
    while (after := _post(ray_url, "/v1/programs/tiny-first/run_batch", {"inputs": INPUTS, "options": {"max_tokens": 24}})).status_code != 200:
        assert time.monotonic() < deadline, after.text
        time.sleep(1.0)
    assert [g.token_ids for g in RunBatchResponse.model_validate_json(after.content).generations] == expected
    metrics = httpx.get(f"{ray_url}/metrics", headers=AUTH).text
    retries = next(float(line.split()[1]) for line in metrics.splitlines() if line.startswith("pawfn_replica_retries_total"))
    failed = sum(answer.status_code == 503 for answer in answers)
    if retries + failed == 0:  # every call had ended or not yet begun at the kill (seen once on a 2-core AMD EPYC)
        pytest.skip("no call was in flight on the replicas when they were killed: the test saw nothing to retry")


def test_the_ray_app_checks_its_arguments_and_scales_on_ongoing_requests() -> None:
    from pawfn import ConfigError
    from pawfn.serve.ray import RayAppArgs, app_builder, ray_app, replica_scaling

    with pytest.raises(ConfigError, match="backend 'tpu'"):
        ray_app(RayAppArgs(programs=["x"], backend="tpu"))
    with pytest.raises(ConfigError, match="replicas"):
        app_builder({"programs": "a", "replicas": 0})
    parsed = RayAppArgs.model_validate({"programs": "a,b=c.paw", "replicas": "2", "max_replicas": "6"})
    assert parsed.programs == ["a", "b=c.paw"]
    assert replica_scaling(parsed) == {"autoscaling_config": {"min_replicas": 2, "max_replicas": 6, "target_ongoing_requests": 4.0}}
    assert replica_scaling(RayAppArgs(replicas=3)) == {"num_replicas": 3}
