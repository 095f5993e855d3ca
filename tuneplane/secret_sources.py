"""The only places a cluster Fleet's credential may be read from.

A Fleet's config names an environment variable or a file; the console reads it at each call
and sends it to the URL the same config names. An administrator can edit that config, so
the names are confined: a variable must be named ``TUNEPLANE_TOKEN_*`` and a file must
lie in ``TUNEPLANE_SECRETS_DIR`` (after symlinks, and never in the console's PKI directory).
Otherwise config could point the console at ``DATABASE_URL`` or the CA key and have it sent
to a URL of the administrator's choosing. The checks run when the config is saved and again
at every read, so a Fleet saved before a rule tightened cannot read past it.
"""

from pathlib import Path, PurePosixPath

from django.conf import settings

TOKEN_ENV_PREFIX = "TUNEPLANE_TOKEN_"
_IN_PKI = "is in the console's PKI directory (TUNEPLANE_PKI_DIR), which holds no cluster credential"


def env_name_refusal(name: str) -> str:
    """Why ``name`` may not hold a cluster credential, or "" when it may."""
    if not name.startswith(TOKEN_ENV_PREFIX) or name == TOKEN_ENV_PREFIX:
        return (
            f"must be an environment variable named {TOKEN_ENV_PREFIX}<something>: "
            "only those may hold a cluster credential"
        )
    return ""


def file_path_refusal(path: str) -> str:
    """Why ``path`` may not hold a cluster credential, or "" when it may (lexically)."""
    secrets_dir = Path(settings.TUNEPLANE_SECRETS_DIR)
    pure = PurePosixPath(path)
    if "\x00" in path:
        return "must not contain a NUL character"
    if not pure.is_absolute():
        return "must be an absolute path"
    if ".." in pure.parts or not _within(Path(pure), secrets_dir):
        return (
            f"must be a file in TUNEPLANE_SECRETS_DIR ({secrets_dir}): only files there "
            "may hold a cluster credential"
        )
    if _within(Path(pure), Path(settings.TUNEPLANE_PKI_DIR)):
        return _IN_PKI
    return ""


def resolved_path_refusal(path: Path) -> str:
    """The lexical check again after symlinks: a link in the secrets directory may not lead
    out of it, nor to the console's own keys."""
    real = path.resolve()
    if not _within(real, Path(settings.TUNEPLANE_SECRETS_DIR).resolve()):
        return "leads out of TUNEPLANE_SECRETS_DIR through a symbolic link"
    if _within(real, Path(settings.TUNEPLANE_PKI_DIR).resolve()):
        return _IN_PKI
    return ""


def _within(path: Path, directory: Path) -> bool:
    return path != directory and path.is_relative_to(directory)
