"""What the group-commit tests of every store share (tests/stores/test_group_commit*.py)."""

from __future__ import annotations

import anyio

from nous_session import ConflictError, CorruptRecordError, SessionActor


async def append_all(
    sessions: list[SessionActor], round_index: int
) -> dict[str, BaseException | int]:
    """Every session appends one event, all at once; what each caller got (a seq or an error).

    Each append is conditional on the count its actor knows (``expect_count``), so one whose
    session another writer advanced behind its back fails with ConflictError (a plain append
    would go again after the other writer's event instead).
    """
    outcomes: dict[str, BaseException | int] = {}

    async def one(session: SessionActor) -> None:
        try:
            (event,) = await session.append_many(
                [("user_message", {"content": f"round {round_index}"})],
                expect_count=session.log.count,
            )
        except (ConflictError, CorruptRecordError) as error:
            outcomes[session.session_id] = error
        else:
            outcomes[session.session_id] = event.seq

    async with anyio.create_task_group() as task_group:
        for session in sessions:
            task_group.start_soon(one, session)
    return outcomes
