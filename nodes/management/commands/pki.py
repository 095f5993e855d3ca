from django.core.management.base import BaseCommand, CommandError

from nodes import pki


class Command(BaseCommand):
    help = "The console CA: `pki init` creates it; `pki issue-gateway --host H` the gateway's cert."

    def add_arguments(self, parser):
        sub = parser.add_subparsers(dest="action", required=True)
        sub.add_parser("init", help="Create the CA in TUNEPLANE_PKI_DIR unless it exists.")
        gateway = sub.add_parser("issue-gateway", help="Issue the gateway's TLS certificate.")
        gateway.add_argument(
            "--host",
            action="append",
            required=True,
            help="A DNS name or IP the gateway answers at (repeatable).",
        )

    def handle(self, *args, action, **options):
        if action == "init":
            made = pki.ca_init()
            self.stdout.write(f"{'Created' if made else 'Kept'} the CA in {pki.pki_dir()}")
            return
        try:
            path = pki.issue_server_certificate(options["host"])
        except pki.PkiMissing as exc:
            raise CommandError(str(exc)) from None
        self.stdout.write(f"Gateway certificate for {', '.join(options['host'])}: {path}")
