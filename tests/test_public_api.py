"""The public surface is deliberate: each package's ``__all__`` is pinned here and is exactly
what it exports (httpx's test_exported_members), and no module imports itself in a cycle."""

from __future__ import annotations

import types

import grimp
import pytest

import api_sender
import worker

#: What `from api_sender import *` gives a user: add a name here when you mean to publish it.
API_SENDER = [
    "USAGE_HELD_QUEUE",
    "USAGE_QUEUE",
    "Actor",
    "InvalidArgument",
    "InvalidJob",
    "Job",
    "JobFilter",
    "JobPage",
    "JobsApi",
    "PermissionDenied",
    "QueueNotFound",
    "QueuesApi",
    "SendOptions",
    "Sender",
    "SenderError",
    "SyncSender",
    "Timers",
    "UsageEvent",
    "UsageRetry",
    "UsageSink",
    "create_pool",
    "new_ulid",
    "usage_send_options",
]
#: What a tool's declaration module imports from the worker.
WORKER = ["Handler", "JobDeclaration", "JobInfo", "QueueOptions", "Schedule"]


@pytest.mark.parametrize(("package", "pinned"), [(api_sender, API_SENDER), (worker, WORKER)])
def test_all_is_pinned_and_is_every_public_name(
    package: types.ModuleType, pinned: list[str]
) -> None:
    """``__all__`` equals the pinned list, and every public non-module name the package holds is
    in it (nothing published by accident, nothing listed that is missing)."""
    assert package.__all__ == pinned
    public = sorted(
        name
        for name in dir(package)
        if not name.startswith("_") and not isinstance(getattr(package, name), types.ModuleType)
    )
    assert public == sorted(pinned)


def test_no_module_imports_itself_through_a_cycle() -> None:
    """The import graph of both packages (TYPE_CHECKING imports included) has no cycle."""
    graph = grimp.build_graph("worker", "api_sender")
    modules = sorted(graph.modules)
    edges = {m: set(graph.find_modules_directly_imported_by(m)) & set(modules) for m in modules}
    cycles = _cycles(edges)
    assert cycles == [], cycles


def _cycles(edges: dict[str, set[str]]) -> list[list[str]]:
    """The strongly connected components with more than one module (Tarjan, iteratively)."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found: list[list[str]] = []
    counter = 0
    for root in edges:
        if root in index:
            continue
        work = [(root, iter(sorted(edges[root])))]
        index[root] = low[root] = counter
        counter += 1
        stack.append(root)
        on_stack.add(root)
        while work:
            node, children = work[-1]
            child = next(children, None)
            if child is not None:
                if child not in index:
                    index[child] = low[child] = counter
                    counter += 1
                    stack.append(child)
                    on_stack.add(child)
                    work.append((child, iter(sorted(edges[child]))))
                elif child in on_stack:
                    low[node] = min(low[node], index[child])
                continue
            work.pop()
            if work:
                parent = work[-1][0]
                low[parent] = min(low[parent], low[node])
            if low[node] == index[node]:
                component = []
                while True:
                    member = stack.pop()
                    on_stack.discard(member)
                    component.append(member)
                    if member == node:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found
