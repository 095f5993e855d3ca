from django.core.management.base import BaseCommand, CommandError

from nodes.downloads import (
    agent_wheel_present,
    build_agent_wheels,
    build_cli_wheel,
    cli_wheel,
    downloads_dir,
    wheels,
)


class Command(BaseCommand):
    help = (
        "Build the tuneplane-node wheel and its dependencies, and the tuneplane CLI's wheel, "
        "into TUNEPLANE_DOWNLOADS_DIR."
    )

    def add_arguments(self, parser):
        parser.add_argument(
            "--if-missing",
            action="store_true",
            help="Build only what is not there yet.",
        )

    def handle(self, *args, if_missing, **options):
        builds = [
            ("tuneplane-node", build_agent_wheels, agent_wheel_present()),
            ("tuneplane CLI", build_cli_wheel, cli_wheel() is not None),
        ]
        wanted = [(name, build) for name, build, present in builds if not (if_missing and present)]
        for name, build in wanted:
            self.stdout.write(f"Building the {name} wheel for /downloads/ …")
            result = build()
            if result.returncode != 0:
                raise CommandError(f"pip wheel failed:\n{result.stderr.strip()[-2000:]}")
        if wanted:
            names = ", ".join(path.name for path in wheels())
            self.stdout.write(f"Wheels in {downloads_dir()}: {names}")
