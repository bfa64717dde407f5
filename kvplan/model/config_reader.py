"""ConfigReader: typed access to one config dict (a Hugging Face config.json or a part of one).

Every read names the file and the field in its error (`text_config.num_key_value_heads: expected
a positive integer`), so a wrong config is one located line. Used by kvplan/model/config.py, the
family rules of kvplan/model/families/ and the modules that read a family's own keys later
(weights.py, step_time.py). Only data is read: no code from a config is ever imported or executed.
"""

from __future__ import annotations

from typing import Any

from kvplan.errors import ConfigError

MAX_VALUE = 2**40  # no config field of a real model comes near this


class ConfigReader:
    """Typed access to one config dict that names the file and field in every error."""

    def __init__(self, raw: dict[str, Any], source: str, prefix: str = "") -> None:
        self.raw, self.source, self.prefix = raw, source, prefix

    def has(self, key: str) -> bool:
        return self.raw.get(key) is not None

    def _fail(self, key: str, expected: str) -> ConfigError:
        return ConfigError(expected, file=self.source, field=self.prefix + key)

    def int(self, *keys: str, default: int | None = None, positive: bool = True, maximum: int = MAX_VALUE) -> int:
        """The first present key as an integer in [1 (0 if not positive), maximum]."""
        for key in keys:
            value = self.raw.get(key)
            if value is None:
                continue
            if isinstance(value, bool) or not isinstance(value, (int, float)):
                raise self._fail(key, f"expected an integer, got {value!r}")
            if isinstance(value, float) and not value.is_integer():
                raise self._fail(key, f"expected an integer, got {value!r}")
            if positive and value <= 0:
                raise self._fail(key, f"expected a positive integer, got {value!r}")
            if value < 0 or value > maximum:
                raise self._fail(key, f"expected an integer between {int(positive)} and {maximum:,}, got {value!r}")
            return int(value)
        if default is not None:
            return default
        raise self._fail(keys[0], "missing; kvplan needs this field to size the model")

    def number(self, key: str, default: float | None = None) -> float:
        """A finite positive number (int or float)."""
        value = self.raw.get(key)
        if value is None:
            if default is None:
                raise self._fail(key, "missing; this field is needed to size the model")
            return default
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not 0 < value <= MAX_VALUE:
            raise self._fail(key, f"expected a positive number, got {value!r}")
        return float(value)

    def opt_int(self, *keys: str) -> int | None:
        if not any(self.has(k) for k in keys):
            return None
        return self.int(*keys)

    def bool(self, key: str, default: bool = False) -> bool:
        value = self.raw.get(key)
        if value is None:
            return default
        if not isinstance(value, bool):
            raise self._fail(key, f"expected true or false, got {value!r}")
        return value

    def sub(self, key: str) -> "ConfigReader":
        value = self.raw.get(key)
        if not isinstance(value, dict):
            raise self._fail(key, "expected an object")
        return ConfigReader(value, self.source, f"{self.prefix}{key}.")
