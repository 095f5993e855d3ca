#!/usr/bin/env python
import os
import sys


def main():
    os.environ.setdefault("DJANGO_SETTINGS_MODULE", "tuneplane.settings")
    if sys.argv[1:2] == ["grpcserve"]:
        # A gateway is scraped on its own port (--metrics-bind): its figures stay its own,
        # not added into the web's through a shared PROMETHEUS_MULTIPROC_DIR.
        os.environ.pop("PROMETHEUS_MULTIPROC_DIR", None)
    from django.core.management import execute_from_command_line

    execute_from_command_line(sys.argv)


if __name__ == "__main__":
    main()
