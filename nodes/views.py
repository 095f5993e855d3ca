"""What a machine fetches before it has an identity: install.sh and the agent's wheels."""

from django.conf import settings
from django.http import FileResponse, Http404, HttpResponse
from django.template.loader import render_to_string
from django.utils.html import escape

from .downloads import (
    CLI_DIGEST_NAME,
    LOCK_NAME,
    cli_digest_text,
    downloads_dir,
    lock_text,
    sha256_of,
    wheels,
)


def install_script(request):
    script = render_to_string(
        "install.sh", {"server": settings.TUNEPLANE_PUBLIC_URL.rstrip("/")}, request=None
    )
    return HttpResponse(script, content_type="text/x-shellscript; charset=utf-8")


def download_index(request):
    """A flat page of links: what ``pip install --find-links`` reads, each with its wheel's
    SHA-256 (pip checks a ``#sha256=`` fragment), and the CLI's digest file."""
    links = [
        f'<a href="{escape(path.name)}#sha256={sha256_of(path)}">{escape(path.name)}</a><br>'
        for path in wheels()
    ]
    if cli_digest_text():
        links.append(f'<a href="{CLI_DIGEST_NAME}">{CLI_DIGEST_NAME}</a><br>')
    body = "\n".join(links)
    return HttpResponse(f"<!DOCTYPE html>\n<html><body>\n{body}\n</body></html>\n")


def download(request, filename: str):
    if filename == LOCK_NAME:
        return HttpResponse(lock_text(), content_type="text/plain; charset=utf-8")
    if filename == CLI_DIGEST_NAME and cli_digest_text():
        return HttpResponse(cli_digest_text(), content_type="text/plain; charset=utf-8")
    path = downloads_dir() / filename
    if "/" in filename or not filename.endswith(".whl") or not path.is_file():
        raise Http404(filename)
    return FileResponse(path.open("rb"), as_attachment=True, filename=filename)
