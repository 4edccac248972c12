"""UUID text: the fast regex path agrees with :class:`uuid.UUID` and never lets other text through."""

from __future__ import annotations

import uuid

import pytest
from hypothesis import given
from hypothesis import strategies as st

from sapwood.platform.storage.postgres.uuids import uuid_array_literal
from sapwood.platform.uuids import canonical_uuid


@given(st.uuids())
def test_every_spelling_gives_the_canonical_text(u: uuid.UUID) -> None:
    for spelling in (str(u), str(u).upper(), u.hex, "{" + str(u) + "}", f"urn:uuid:{u}"):
        assert canonical_uuid(spelling) == str(u)


@pytest.mark.parametrize("text", ["", "not-a-uuid", "1234", "g" * 32, "00000000-0000-0000-0000-00000000000"])
def test_text_that_is_not_a_uuid_is_refused(text: str) -> None:
    with pytest.raises(ValueError):
        canonical_uuid(text)


def test_array_literal_is_canonical_whatever_the_input_spelling() -> None:
    ids = [uuid.uuid4() for _ in range(5)]
    expected = "{" + ",".join(map(str, ids)) + "}"
    assert uuid_array_literal([str(u) for u in ids]) == expected
    assert uuid_array_literal([u.hex.upper() for u in ids]) == expected


def test_array_literal_refuses_text_that_would_change_the_array() -> None:
    a, b = str(uuid.uuid4()), str(uuid.uuid4())
    with pytest.raises(ValueError):
        uuid_array_literal([a + "}," + "{" + b])  # element boundaries smuggled in
    with pytest.raises(ValueError):
        uuid_array_literal([a, "x"])
    with pytest.raises(ValueError):
        uuid_array_literal([f"{a},{b}"])  # one value holding two ids is not two ids
    with pytest.raises(ValueError):
        uuid_array_literal([f"{a},{b}", a])
