"""Serializer parts that refuse what DRF would quietly coerce or drop.

DRF turns ``5`` into ``"5"`` for a CharField and ignores fields it does not
know; an API that does either loses what the caller meant.
"""

import difflib

from rest_framework import serializers


class StrictCharField(serializers.CharField):
    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid")
        return super().to_internal_value(data)


class StrictChoiceField(serializers.ChoiceField):
    default_error_messages = {
        "invalid_choice": '"{input}" is not one of: {allowed}.',
        "invalid_type": "Must be a string.",
    }

    def to_internal_value(self, data):
        if not isinstance(data, str):
            self.fail("invalid_type")
        if data not in self.choices:
            self.fail("invalid_choice", input=data[:80], allowed=", ".join(self.choices))
        return data


class StrictSerializer(serializers.Serializer):
    """A request body: every field it carries must be one this serializer reads.

    Known read-only fields (what a GET returned) are accepted and ignored, so a
    client may send back what it read.
    """

    read_only_names: tuple[str, ...] = ()

    def to_internal_value(self, data):
        """The body's every error at once: its unknown fields (each with the field it
        nearly names) together with what the known ones got wrong."""
        unknown: dict = {}
        if isinstance(data, dict):
            known = set(self.fields) | set(self.read_only_names)
            writable = sorted(name for name, field in self.fields.items() if not field.read_only)
            unknown = {
                str(key): [unknown_field(str(key), writable)] for key in data if key not in known
            }
            data = {key: value for key, value in data.items() if key in known}
        try:
            value = super().to_internal_value(data)
        except serializers.ValidationError as error:
            if not unknown:
                raise
            found = error.detail if isinstance(error.detail, dict) else {"body": error.detail}
            raise serializers.ValidationError({**dict(sorted(unknown.items())), **found}) from None
        if unknown:
            raise serializers.ValidationError(dict(sorted(unknown.items())))
        return value


def unknown_field(name: str, fields: list[str]) -> str:
    """What an unknown field is told: the field it nearly names, if one does."""
    near = difflib.get_close_matches(name.lower(), fields, n=1, cutoff=0.7)
    hint = f' Did you mean "{near[0]}"?' if near else ""
    return f"Unknown field; nothing was changed.{hint}"
