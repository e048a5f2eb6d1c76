"""Test swiftlets ``test$a`` … ``test$e``: real swiftlets whose behaviour the config sets.

Registered in-process (``Router.from_file(path, plugins=[probe_plugin])``), never through
an entry point, so they exist only in the tests that ask for them.
"""

from __future__ import annotations

import attrs
import trio

from martinet.kernel import PoolSpec, SwiftletContext, SwiftletSpec, config_class, hookimpl, prop


@config_class
@attrs.frozen(kw_only=True)
class ProbeConfig:
    fail: str = prop(
        "never",
        choices=("never", "start", "run", "return"),
        description="When to fail: never; before started(); 1 s after started; or return from run().",
    )
    cleanup_ms: int = prop(0, min=0, max=600_000, description="Time spent in awaited cleanup.")
    note: str = prop("", description="A free text property, changed by tests.")


class ProbeSwiftlet:
    def __init__(self, context: SwiftletContext):
        self.context = context
        self.cleaned_up = False
        self.cleanup_finished = False

    async def run(self, *, task_status: trio.TaskStatus[None] = trio.TASK_STATUS_IGNORED) -> None:
        config = self.context.config
        if config.fail == "start":
            raise OSError(f"{self.context.name} cannot bind its port")
        task_status.started()
        try:
            if config.fail == "return":
                return
            if config.fail == "run":
                await trio.sleep(1)
                raise ValueError(f"{self.context.name} lost its mind")
            await trio.sleep_forever()
        finally:
            self.cleaned_up = True
            if config.cleanup_ms:
                with self.context.shutdown_scope():
                    await trio.sleep(config.cleanup_ms / 1000)
                    self.cleanup_finished = True


@hookimpl
def martinet_swiftlets() -> list[SwiftletSpec]:
    return [
        SwiftletSpec(
            name=f"test${letter}",
            description="probe",
            config=ProbeConfig,
            factory=ProbeSwiftlet,
            pools=[
                PoolSpec(name=f"{letter}.serial", description="max 1", max_concurrency=1),
                PoolSpec(name=f"{letter}.wide", description="max 4", max_concurrency=4, queue_size=8),
            ],
        )
        for letter in "abcde"
    ]
