from django.core.management.base import BaseCommand, CommandError

from nodes.downloads import agent_wheel_present, build_agent_wheels, downloads_dir, wheels


class Command(BaseCommand):
    help = "Build the tuneplane-node wheel and its dependencies into TUNEPLANE_DOWNLOADS_DIR."

    def add_arguments(self, parser):
        parser.add_argument(
            "--if-missing",
            action="store_true",
            help="Do nothing when an agent wheel is already there.",
        )

    def handle(self, *args, if_missing, **options):
        if if_missing and agent_wheel_present():
            return
        self.stdout.write("Building the tuneplane-node wheel for /downloads/ …")
        result = build_agent_wheels()
        if result.returncode != 0:
            raise CommandError(f"pip wheel failed:\n{result.stderr.strip()[-2000:]}")
        names = ", ".join(path.name for path in wheels())
        self.stdout.write(f"Agent wheels in {downloads_dir()}: {names}")
