"""A throwaway CA and certificates for mutual-TLS tests, made with the openssl CLI."""

from __future__ import annotations

import subprocess
from pathlib import Path


def _run(*args: str, cwd: Path) -> None:
    subprocess.run(["openssl", *args], cwd=cwd, check=True, capture_output=True)


def make_ca(folder: Path) -> Path:
    """A self-signed CA in `folder` (ca.key, ca.pem)."""
    _run("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key", "-out", "ca.pem",
         "-days", "2", "-subj", "/CN=boomerang-test-ca", cwd=folder)
    return folder / "ca.pem"


def issue(folder: Path, name: str, common_name: str, ip: str = "127.0.0.1") -> tuple[Path, Path]:
    """A certificate for `common_name`, valid for `ip`, signed by the CA in `folder`."""
    ext = folder / f"{name}.ext"
    ext.write_text(f"subjectAltName=IP:{ip},DNS:localhost\n")
    _run("req", "-newkey", "rsa:2048", "-nodes", "-keyout", f"{name}.key", "-out", f"{name}.csr",
         "-subj", f"/CN={common_name}", cwd=folder)
    _run("x509", "-req", "-in", f"{name}.csr", "-CA", "ca.pem", "-CAkey", "ca.key", "-CAcreateserial",
         "-out", f"{name}.pem", "-days", "2", "-extfile", ext.name, cwd=folder)
    return folder / f"{name}.pem", folder / f"{name}.key"
