from django.core.management.base import BaseCommand

from tuneplane.schedule import SCHEDULE, seed_schedule


class Command(BaseCommand):
    help = "Write the beat schedule (intervals from settings) into django-celery-beat's tables."

    def handle(self, *args, **options):
        seed_schedule()
        self.stdout.write(f"beat schedule: {', '.join(SCHEDULE)}")
