from django.db import models


class ActorType(models.TextChoices):
    USER = "user", "user"
    NODE = "node", "node"
    SYSTEM = "system", "system"
