"""Serializer parts that refuse what DRF would quietly coerce or drop.

DRF turns ``5`` into ``"5"`` for a CharField and ignores fields it does not
know; an API that does either loses what the caller meant.
"""

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
        if isinstance(data, dict):
            known = set(self.fields) | set(self.read_only_names)
            unknown = sorted(str(key) for key in data if key not in known)
            if unknown:
                raise serializers.ValidationError(
                    {name: ["Unknown field; nothing was changed."] for name in unknown}
                )
        return super().to_internal_value(data)
