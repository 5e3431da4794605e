"""Terminal-Bench's :class:`~compactrl.task.Builder` (``BUILDER``): a task's Dockerfile steps replayed for
the local backend (:mod:`.local_build`), named by the loader in ``Task.build.builder`` and run through
:func:`compactrl.task.prepared` before the episode; and its :class:`~compactrl.task.ImageBuilder`, the
task's own image built for the docker backend (:mod:`.image_build`), reached through
:func:`compactrl.task.built_image` when the docker sandbox starts."""

from __future__ import annotations

import dataclasses

from compactrl.sandbox.docker import DockerEngine
from compactrl.task import Task
from compactrl.tasksets.terminal_bench.image_build import engine_image
from compactrl.tasksets.terminal_bench.local_build import PrepareError, prepare, with_local_state


def needs_state(task: Task) -> bool:
    """Whether ``task`` has Dockerfile steps (or the reason they cannot run) and no prepared state yet."""
    build = task.build
    return build is not None and (build.plan is not None or bool(build.error)) and not task.runtime.state


@dataclasses.dataclass(frozen=True)
class DockerfileReplay:
    """Prepares a Terminal-Bench task's replayed Dockerfile state for the local backend, and builds its own
    image for the docker backend (:meth:`image`, which the sandbox asks for when it starts: the build needs
    its engine and options); other backends need nothing prepared."""

    def prepare(self, task: Task, backend: str) -> Task:
        """``task`` with :attr:`~compactrl.task.Runtime.state` from the cache, or built now without downloads
        (:func:`.local_build.with_local_state`: a state that cannot be prepared is a
        :class:`~compactrl.sandbox.SandboxError` naming the task); unchanged on other backends."""
        if backend != "local" or not needs_state(task):
            return task
        return with_local_state(task)

    def image(self, task: Task, engine: DockerEngine) -> str:
        """Tag of ``task``'s own image on ``engine`` (:func:`.image_build.engine_image`: built from
        ``Task.runtime.image_build``, or reused when its content is unchanged)."""
        return engine_image(task, engine)


BUILDER = DockerfileReplay()
#: this module's name, which the loader records in ``Task.build.builder``
MODULE = __name__


def prepare_at_load(task: Task, cache: str | None) -> Task:
    """The loader's preparation (``TerminalBenchConfig(prepare=True)``): downloads allowed, and a state that
    cannot be prepared makes the task not gradable with the reason, instead of raising."""
    try:
        state = prepare(task, cache)
    except PrepareError as e:
        return dataclasses.replace(task, grading=dataclasses.replace(task.grading, not_gradable=str(e)))
    return dataclasses.replace(task, runtime=dataclasses.replace(task.runtime, state=state))
