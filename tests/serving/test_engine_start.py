"""How the panel starts an engine on a CPU host and on a GPU host (decision 0074): on a CPU host, vLLM's older
compile cache (VLLM_USE_AOT_COMPILE=0) and, for a one-worker profile, the worker in the engine's own process (the
"uni" executor, which the CPU platform allows only with VLLM_ENABLE_V1_MULTIPROCESSING=0), before extra_args so that
a profile may still ask for another executor. Every engine test of the suite starts its engines this way."""
from panel.serving.services import CPU_ENGINE_ENV, CPU_ONE_WORKER_ARGS, engine_env, launch_argv
from tests.support.dashboards import make_deployment


def test_a_cpu_host_starts_one_worker_in_the_engine_process_and_a_gpu_host_as_vllm_does(db, team_setup):
    deployment = make_deployment(team_setup["team_a"])
    profile = deployment.profile

    cpu = launch_argv(profile, port=8001, cpu_host=True)
    at = cpu.index("--distributed-executor-backend=uni")
    assert cpu[at:at + 1] == CPU_ONE_WORKER_ARGS and cpu[at - 1] == "--port=8001"
    assert not any(token.startswith("--distributed-executor-backend")
                   for token in launch_argv(profile, port=8001))  # a GPU host: vLLM decides
    assert engine_env(deployment, host_is_gpu=False).items() >= CPU_ENGINE_ENV.items()
    gpu_env = engine_env(deployment, host_is_gpu=True)
    assert not set(gpu_env) & set(CPU_ENGINE_ENV) and "VLLM_CPU_KVCACHE_SPACE" not in gpu_env

    profile.extra_args = "--distributed-executor-backend mp --enforce-eager"  # the profile's word comes last
    argv = launch_argv(profile, port=8001, cpu_host=True, sleep_mode=True)
    assert argv[-4:] == [*CPU_ONE_WORKER_ARGS, "--distributed-executor-backend=mp", "--enforce-eager",
                         "--enable-sleep-mode"]

    profile.extra_args, profile.tensor_parallel_size = "", 2  # two workers need vLLM's multiprocess executor
    assert not any(token.startswith("--distributed-executor-backend")
                   for token in launch_argv(profile, port=8001, cpu_host=True))
