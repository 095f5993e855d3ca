from django.db import models


class ActorType(models.TextChoices):
    USER = "user"
    NODE = "node"
    SYSTEM = "system"
