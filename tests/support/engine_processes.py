"""The vLLM engine processes running a model, found by their command line."""
import psutil


def engine_processes(model_path):
    """Every process whose command line names the model: the API server and its engine core."""
    found = []
    for process in psutil.process_iter(["cmdline", "status"]):
        if process.info["status"] == psutil.STATUS_ZOMBIE:
            continue
        if str(model_path) in " ".join(process.info["cmdline"] or []):
            found.append(process)
    return found
