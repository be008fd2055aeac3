"""Validation rules declared once and enforced twice: by Kubernetes (CEL) and offline (pydantic).

A :class:`Rule` is one row of the rule table: a CEL expression, a message, a fix, and a Python
predicate. The CRD generator emits the CEL expression as an ``x-kubernetes-validations`` entry
whose message is ``"<message>: <fix>"``; pydantic runs the predicate and reports the same message
and fix. The models declare each rule exactly once.

Invariant: for every document, the CEL expression holds exactly when the predicate returns True.
The predicates read the pydantic model, where an absent optional field is ``None`` and an absent
list or map is empty; the CEL expressions therefore guard with ``has()`` wherever the CRD gives the
field no default. CEL is kept to the subset the test API emulator evaluates: field access,
``has()``, ``size()``, ``bytes()``, ``in``, comparisons and ``&&``/``||``/``!``.

Three shapes:

- object rules, listed in a model's ``rules`` class attribute; ``self`` is the object and the
  predicate takes the model instance;
- transition rules, object rules whose CEL mentions ``oldSelf``; Kubernetes evaluates them on
  UPDATE only (and only when the old object has the node), so pydantic does not run them on a
  single document: :func:`transition_violations` compares two models instead, and the predicate
  takes ``(new, old)``;
- field rules, used as ``Annotated[...]`` metadata; ``self`` is the field value.

:class:`ListKeys` is the same idea for uniqueness: ``x-kubernetes-list-type`` map/set makes the
API server reject duplicate entries, and the same annotation makes pydantic reject them.

Failure mode: violated rules raise one ``ValidationError`` listing every violation of the node
(all broken rules of an object, all duplicates of a list), each of type :data:`RULE_ERROR` with
``message`` and ``fix`` in its context and located at the rule's ``fieldPath`` (``.tables``,
``[1]``), so offline errors name the same field as the server. Object rules run only once the
object's fields are valid, as pydantic runs model validators after field validation.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any, ClassVar

from pydantic import BaseModel, ConfigDict, ValidationError, model_validator
from pydantic.alias_generators import to_camel
from pydantic_core import InitErrorDetails, PydanticCustomError, core_schema

from lakeslot.api.paths import Location, parse_path

RULE_ERROR = "lakeslot_rule"

Violation = tuple[Location, str, str]  # (location relative to the checked node, message, fix)


def violations_error(title: str, value: Any, violations: list[Violation]) -> ValidationError:
    """One error listing every violation; pydantic prefixes each location with the node's own."""
    return ValidationError.from_exception_data(
        title,
        [
            InitErrorDetails(
                type=PydanticCustomError(RULE_ERROR, "{message}", {"message": message, "fix": fix}),
                loc=loc,
                input=value,
            )
            for loc, message, fix in violations
        ],
    )


def _add_validations(json_schema: dict[str, Any], entries: list[dict[str, str]]) -> None:
    json_schema.setdefault("x-kubernetes-validations", []).extend(entries)


@dataclass(frozen=True)
class Rule:
    """One CEL rule with its Python twin (see the module docstring for the three shapes)."""

    cel: str
    message: str
    fix: str
    check: Callable[..., bool]
    field_path: str = ""  # relative JSONPath reported by Kubernetes, e.g. ".slotName"
    # Where ``lakeslot validate`` reports it when Kubernetes cannot take a fieldPath (a rule at
    # the root about ``metadata.name``: the CRD's schema has no properties under metadata).
    offline_path: str = ""

    @property
    def is_transition(self) -> bool:
        return "oldSelf" in self.cel

    def kubernetes(self) -> dict[str, str]:
        entry = {"rule": self.cel, "message": f"{self.message}: {self.fix}"}
        if self.field_path:
            entry["fieldPath"] = self.field_path
        return entry

    def violation(self) -> Violation:
        return parse_path(self.field_path or self.offline_path), self.message, self.fix

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        def enforce(value: Any) -> Any:
            if not self.check(value):
                raise violations_error("field rule", value, [self.violation()])
            return value

        return core_schema.no_info_after_validator_function(enforce, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        json_schema = handler(schema)
        _add_validations(json_schema, [self.kubernetes()])
        return json_schema


@dataclass(frozen=True)
class ListKeys:
    """A list whose entries are unique: by the given keys (list-type map) or by value (set)."""

    keys: tuple[str, ...] = ()

    def _key(self, item: Any) -> Any:
        if not self.keys:
            return item
        document = item.model_dump(by_alias=True)
        return tuple(document[key] for key in self.keys)

    def _describe(self) -> str:
        return " and ".join(self.keys) if self.keys else "value"

    def __get_pydantic_core_schema__(self, source: Any, handler: Any) -> core_schema.CoreSchema:
        def enforce(items: list[Any]) -> list[Any]:
            seen: set[Any] = set()
            duplicates: list[Violation] = []
            for index, item in enumerate(items):
                key = self._key(item)
                if key in seen:
                    fix = f"list each entry once (entries are identified by {self._describe()})"
                    duplicates.append(((index,), f"duplicate entry {key!r}", fix))
                seen.add(key)
            if duplicates:
                raise violations_error("unique list", items, duplicates)
            return items

        return core_schema.no_info_after_validator_function(enforce, handler(source))

    def __get_pydantic_json_schema__(self, schema: Any, handler: Any) -> dict[str, Any]:
        json_schema = handler(schema)
        json_schema["x-kubernetes-list-type"] = "map" if self.keys else "set"
        if self.keys:
            json_schema["x-kubernetes-list-map-keys"] = list(self.keys)
        return json_schema


class ApiModel(BaseModel):
    """Base of every API object: camelCase aliases, strict types, unknown fields rejected.

    Strict mode matches the API server: ``"5432"`` is not an integer and ``yes`` is not a string.
    Python code may construct models with snake_case names; documents are validated by alias only
    (see ``lakeslot.api.validation``).
    """

    model_config = ConfigDict(
        strict=True,
        extra="forbid",
        alias_generator=to_camel,
        validate_by_name=True,
        validate_by_alias=True,
    )

    rules: ClassVar[tuple[Rule, ...]] = ()

    @model_validator(mode="after")
    def enforce_rules(self) -> ApiModel:
        broken = [rule.violation() for rule in self.rules if not rule.is_transition and not rule.check(self)]
        if broken:
            raise violations_error(type(self).__name__, self, broken)
        return self

    def to_document(self) -> dict[str, Any]:
        """The JSON-ready document: camelCase, only the fields that were set (defaults stay implicit)."""
        return self.model_dump(mode="json", by_alias=True, exclude_unset=True)

    @classmethod
    def __get_pydantic_json_schema__(cls, schema: Any, handler: Any) -> dict[str, Any]:
        json_schema = super().__get_pydantic_json_schema__(schema, handler)
        if cls.rules:
            _add_validations(handler.resolve_ref_schema(json_schema), [rule.kubernetes() for rule in cls.rules])
        return json_schema


def transition_violations(
    new: ApiModel, old: ApiModel, loc: tuple[str, ...] = ()
) -> Iterator[tuple[tuple[str, ...], Rule]]:
    """Every transition rule that rejects changing ``old`` into ``new``, with its object location.

    Like Kubernetes, a rule is evaluated only where both objects have the node; lists are not
    descended into (no transition rule lives inside a list).
    """
    for rule in new.rules:
        if rule.is_transition and not rule.check(new, old):
            yield loc, rule
    for name, field in type(new).model_fields.items():
        child_new, child_old = getattr(new, name), getattr(old, name)
        if isinstance(child_new, ApiModel) and isinstance(child_old, ApiModel):
            yield from transition_violations(child_new, child_old, (*loc, field.alias or name))
