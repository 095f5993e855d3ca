from django.db import models

# Labels are the values: the admin shows the product page's own words.


class SchedulingState(models.TextChoices):
    ENROLLED = "enrolled", "enrolled"
    SCHEDULABLE = "schedulable", "schedulable"
    CORDONED = "cordoned", "cordoned"
    DRAINING = "draining", "draining"
    DRAINED = "drained", "drained"
    GONE = "gone", "gone"
    REMOVED = "removed", "removed"
