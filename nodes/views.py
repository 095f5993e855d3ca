"""What a machine fetches before it has an identity: install.sh and the agent's wheels."""

from django.conf import settings
from django.http import FileResponse, Http404, HttpResponse
from django.template.loader import render_to_string
from django.utils.html import escape

from .downloads import LOCK_NAME, downloads_dir, lock_text, wheels


def install_script(request):
    script = render_to_string(
        "install.sh", {"server": settings.TUNEPLANE_PUBLIC_URL.rstrip("/")}, request=None
    )
    return HttpResponse(script, content_type="text/x-shellscript; charset=utf-8")


def download_index(request):
    """A flat page of links: what ``pip install --find-links`` reads."""
    links = "\n".join(
        f'<a href="{escape(path.name)}">{escape(path.name)}</a><br>' for path in wheels()
    )
    return HttpResponse(f"<!DOCTYPE html>\n<html><body>\n{links}\n</body></html>\n")


def download(request, filename: str):
    if filename == LOCK_NAME:
        return HttpResponse(lock_text(), content_type="text/plain; charset=utf-8")
    path = downloads_dir() / filename
    if "/" in filename or not filename.endswith(".whl") or not path.is_file():
        raise Http404(filename)
    return FileResponse(path.open("rb"), as_attachment=True, filename=filename)
