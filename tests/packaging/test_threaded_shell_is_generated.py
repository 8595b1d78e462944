"""The threaded limiter (limiter.py, and shell.py below it, and the threaded backends'
operations, backends/operations.py) is what scripts/generate_sync.py makes of aio.py
(shell_async.py, backends/operations_async.py).

The check runs on the checkout as it is (CI's step), and on a copy where either file was
changed by hand, which it must refuse, and which the generator then puts right.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
GENERATOR = Path("scripts/generate_sync.py")
AIO = Path("gateway_limiter/aio.py")
LIMITER = Path("gateway_limiter/limiter.py")
SHELL_ASYNC = Path("gateway_limiter/shell_async.py")
SHELL = Path("gateway_limiter/shell.py")
OPERATIONS_ASYNC = Path("gateway_limiter/backends/operations_async.py")
OPERATIONS = Path("gateway_limiter/backends/operations.py")


def run(root: Path, *args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(root / GENERATOR), *args],
        cwd=root,
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )


def copy_of_checkout(tmp_path: Path) -> Path:
    package = Path("gateway_limiter/__init__.py")  # so that ruff sorts its imports first-party
    twins = (AIO, LIMITER, SHELL_ASYNC, SHELL, OPERATIONS_ASYNC, OPERATIONS)
    for path in (GENERATOR, *twins, package, Path("pyproject.toml")):
        (tmp_path / path).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(ROOT / path, tmp_path / path)
    return tmp_path


def test_the_checked_in_threaded_shell_is_up_to_date() -> None:
    done = run(ROOT, "--check")
    assert done.returncode == 0, done.stderr
    generated = (ROOT / LIMITER).read_text()
    head = "\n".join(generated.splitlines()[:5]).lower()
    assert "generated" in head and "do not edit" in head
    # a member between the asyncio-only markers stays the asyncio limiter's alone
    assert "    def abandon(self) -> None:" in (ROOT / AIO).read_text()
    assert "def abandon" not in generated
    shell = (ROOT / SHELL).read_text()
    head = "\n".join(shell.splitlines()[:5]).lower()
    assert "generated" in head and "do not edit" in head
    assert "class Shell(LimiterCore):" in shell
    assert "async" not in shell.replace("shell_async", "").replace("asyncio", "")
    operations = (ROOT / OPERATIONS).read_text()
    head = "\n".join(operations.splitlines()[:5]).lower()
    assert "generated" in head and "do not edit" in head
    assert "class Operations:" in operations
    assert "async" not in operations.replace("operations_async", "").replace("asyncio", "")


def test_a_hand_edit_of_the_threaded_shell_fails_the_check(tmp_path: Path) -> None:
    root = copy_of_checkout(tmp_path)
    limiter = root / LIMITER
    limiter.write_text(limiter.read_text().replace("time.sleep", "time.sleep (edited)", 1))
    done = run(root, "--check")
    assert done.returncode == 1
    assert "limiter.py is stale" in done.stderr
    assert "(edited)" in done.stderr  # the diff shows what differs
    assert run(root).returncode == 0  # generating puts it right
    assert run(root, "--check").returncode == 0
    assert limiter.read_text() == (ROOT / LIMITER).read_text()


def test_a_change_to_the_asyncio_shell_reaches_the_threaded_one(tmp_path: Path) -> None:
    root = copy_of_checkout(tmp_path)
    aio = root / AIO
    source = aio.read_text()
    marker = "        await self.backend.aclose()\n"
    assert marker in source
    aio.write_text(source.replace(marker, marker + "        await sleep_async(0.0)\n", 1))
    assert run(root, "--check").returncode == 1
    assert run(root).returncode == 0
    generated = (root / LIMITER).read_text()
    assert "        self.backend.close()\n        sleep(0.0)\n" in generated
    assert "async" not in generated.split("# --- asyncio only")[0].replace("asyncio", "")


def test_a_hand_edit_of_the_threaded_io_half_fails_the_check(tmp_path: Path) -> None:
    root = copy_of_checkout(tmp_path)
    shell = root / SHELL
    shell.write_text(shell.read_text().replace("self.backend.reserve(", "(edited)(", 1))
    done = run(root, "--check")
    assert done.returncode == 1
    assert "shell.py is stale" in done.stderr
    assert "limiter.py is stale" not in done.stderr  # only the file that differs
    assert "(edited)" in done.stderr
    assert run(root).returncode == 0
    assert shell.read_text() == (ROOT / SHELL).read_text()


def test_a_change_to_the_asyncio_io_half_reaches_the_threaded_one(tmp_path: Path) -> None:
    root = copy_of_checkout(tmp_path)
    source = root / SHELL_ASYNC
    marker = "        await self._renewer.stop()\n"
    assert marker in source.read_text()
    source.write_text(
        source.read_text().replace(marker, marker + "        await sleep_async(0.0)\n")
    )
    assert run(root, "--check").returncode == 1
    assert run(root).returncode == 0
    assert "        self._renewer.stop()\n        sleep(0.0)\n" in (root / SHELL).read_text()
    assert (root / LIMITER).read_text() == (ROOT / LIMITER).read_text()
