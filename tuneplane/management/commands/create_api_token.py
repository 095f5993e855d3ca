from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from audit.services import Actor
from tuneplane.services import api_token_create


class Command(BaseCommand):
    help = "Make an API token for USERNAME and print it once; only its hash is stored."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="", help="What the token is for.")

    def handle(self, *args, username, name, **options):
        user = get_user_model().objects.filter(username=username).first()
        if user is None:
            raise CommandError(f"no user '{username}'")
        if not user.is_active:
            raise CommandError(f"user '{username}' is not active")
        _, secret = api_token_create(
            actor=Actor.system("manage.py create_api_token"), user=user, name=name
        )
        self.stdout.write(secret)
        self.stderr.write(
            f"Token for {username}{' (administrator)' if user.is_staff else ''}. "
            "It is shown this once; store it now."
        )
