"""The request models of floe's API: stac-fastapi's own, with what floe checks differently.

The page size is checked against floe's maximum instead of cropped silently,
a POST search body must be a JSON object, and a POSTed filter may be
cql2-text as well as cql2-json.
"""

from typing import Annotated, Any, Literal

import attr
from fastapi import Query
from pydantic import BaseModel, Field, PositiveInt, field_validator, model_validator
from stac_fastapi.api.models import ItemCollectionUri
from stac_fastapi.extensions import FilterExtension
from stac_fastapi.extensions.filter.request import FilterExtensionPostRequest
from stac_fastapi.types.search import BaseSearchGetRequest, BaseSearchPostRequest

_LIMIT_HELP = "The number of items per page (at most the server's maximum, 10,000 by default)."


# Request models: the framework's, with the page size checked against floe's maximum instead of cropped silently.
@attr.s
class SearchGetRequest(BaseSearchGetRequest):
    limit: Annotated[PositiveInt | None, Query(description=_LIMIT_HELP)] = attr.ib(default=10)


class SearchPostRequest(BaseSearchPostRequest):
    limit: PositiveInt | None = Field(10, description=_LIMIT_HELP)

    @model_validator(mode="before")
    @classmethod
    def _fields_not_null(cls, data: Any) -> Any:
        # A body that is not a JSON object (an array, a number, form fields) would reach stac-pydantic's own
        # validators, which call .get on it and fail with a 500: refuse it here, as a 4xx, with the reason.
        if not isinstance(data, dict):
            raise ValueError(f"the search body must be a JSON object, not {type(data).__name__}")
        if "fields" in data and data["fields"] is None:
            raise ValueError("fields must be an object {include: [...], exclude: [...]}, not null")
        return data

    @field_validator("collections", "ids", mode="before")
    @classmethod
    def _comma_separated(cls, value: Any) -> Any:
        # Clients send one id as a plain string (or ids joined by commas): accept it as the list it means.
        return [part for part in value.split(",") if part] if isinstance(value, str) else value


@attr.s
class ItemsGetRequest(ItemCollectionUri):
    limit: Annotated[PositiveInt | None, Query(description=_LIMIT_HELP)] = attr.ib(default=10)


class FilterPostRequest(FilterExtensionPostRequest):
    """The filter extension's POST fields, accepting cql2-text too (the language is inferred when not given)."""

    # Wider than the base model's types on purpose: the base accepts only cql2-json in POST bodies.
    filter_expr: dict[str, Any] | str | None = Field(  # type: ignore[assignment]
        None, alias="filter", description="A CQL2 filter."
    )
    filter_lang: Literal["cql2-json", "cql2-text"] | None = Field(  # type: ignore[assignment]
        None, alias="filter-lang", description="cql2-json or cql2-text (default: from the filter's form)."
    )


@attr.s
class FloeFilterExtension(FilterExtension):
    POST: type[BaseModel] = FilterPostRequest
