"""Mutation check: plant realistic faults one at a time and see whether the tests catch them.

    .venv/bin/python bench/mutants.py [--list] [--only NAME[,NAME]] [--area AREA] [--jobs N]
                                      [--timeout S] [--logs FOLDER] [--keep] [--unmutated]

Each mutant (:data:`MUTANTS`) is a textual patch of the real code: a file, a snippet that
must occur in it exactly once, its replacement, a line saying which promise the fault
breaks, and the tests that should catch it (pytest arguments: node ids, or a file and
``-k`` expression). For each mutant the tracked files (``git ls-files``, as they are in the
working tree) are copied into a temporary folder, the patch is applied there, and pytest
runs the mutant's tests in that copy with this interpreter. A snippet that is not found
exactly once is reported as ``does not apply`` (the code moved: update the mutant), never
as caught. The table gives each mutant's outcome and seconds; the exit status is 1 when a
mutant survived, did not apply or could not be judged (a timeout, a skip, a broken
selection).

A selection whose every test skipped itself (an outside tool or a non-loopback address is
missing on this machine) is reported as ``skipped``: not judged, so not a pass either.

``--unmutated`` runs the same selections on an unpatched copy instead: every one must
pass (a selection that fails without a fault proves nothing when it fails with one).

Importing the copy. This checkout is installed editable in setuptools' strict mode: a link
tree under ``build/`` whose files point at *this* checkout, so a plain ``import martinet``
would test the original. The copy gets its own link tree (``<tmp>/site/martinet/…``, built
from ``pyproject.toml``'s ``package-dir``, pointing at the copy's files), first on
``PYTHONPATH``; every process the tests start (``python -m martinet.kernel``, the store's
engine process, Spark's Python workers) inherits it. Before any test runs, a small pytest
plugin (``-p``) checks in the test process itself that every ``martinet`` package and the
patched module resolve into the copy and that the patched module holds the replacement; a
copy that does not is an error, not a result.

Not part of CI: a full run takes about 7 minutes on the 2-core development machine (more when
it is busy; see docs/development.md).
"""

from __future__ import annotations

import argparse
import concurrent.futures
import contextlib
import os
import re
import shlex
import shutil
import signal
import subprocess
import sys
import tempfile
import textwrap
import threading
import time
import tomllib
from dataclasses import dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent

# pytest's exit codes (pytest.ExitCode): 0 all passed, 1 some failed
PASSED, FAILED = 0, 1


@dataclass(frozen=True)
class Mutant:
    name: str
    area: str
    file: str  # relative to the repository's top folder
    original: str  # must occur in the file exactly once
    replacement: str
    description: str  # the realistic bug, and the promise it breaks
    tests: tuple[str, ...]  # pytest arguments: node ids, or a file with "-k", "expr"


def M(name: str, area: str, file: str, original: str, replacement: str, description: str, *tests: str) -> Mutant:
    return Mutant(name, area, file, original, replacement, description, tests)


T = "tests/"
ROUTING_TESTS = T + "swiftlets/routing/"
TOPIC_TESTS = T + "swiftlets/topicmanager/"
QUEUE_TESTS = T + "swiftlets/queuemanager/"
TRANSFER = "swiftlets/routing/transfer.py"
SENDING = "swiftlets/routing/sending.py"
RECEIVING = "swiftlets/routing/receiving.py"
REWRITE = "swiftlets/routing/rewrite.py"
LINKWORK = "swiftlets/routing/linkwork.py"
HANDSHAKE = "swiftlets/routing/handshake.py"
XARECOVERY = "swiftlets/routing/xarecovery.py"
DELIVERY = "swiftlets/routing/delivery.py"
WINDOW = "swiftlets/routing/window.py"
EXCHANGE = "swiftlets/routing/exchange.py"
LIMITS = ROUTING_TESTS + "test_limits.py"
FAULTS = ROUTING_TESTS + "test_fault_points.py"
NETWORK = ROUTING_TESTS + "test_transfer_network.py"

MUTANTS: list[Mutant] = []

# -- routing transfer -----------------------------------------------------------------------------

MUTANTS += [
    M(
        "refused-transaction-committed",
        "transfer",
        SENDING,
        "        transaction = self._outbound.pop(xid)\n        await transaction.rollback()",
        "        transaction = self._outbound.pop(xid)\n        await transaction.commit()",
        "The sender commits a transaction the receiver refused instead of rolling it back: the "
        "messages leave rt$R and are never delivered (lost).",
        LIMITS + "::test_a_refused_transaction_is_rolled_back_and_sent_again_until_it_is_taken",
    ),
    M(
        "inbound-batch-left-in-a-cycle",
        "transfer",
        LINKWORK,
        "        then, self.then = self.then, _answered\n        then(self.error)",
        "        self.then(self.error)",
        "An answered inbound batch keeps its write's callback, which refers back to it: every "
        "routed transaction's messages wait for the cyclic collector, which then runs every "
        "couple of hundred transactions (memory held, CPU per message up).",
        NETWORK + "::test_routed_messages_are_freed_by_reference_counting_not_left_in_cycles",
    ),
    M(
        "forwarded-message-spliced-anew",
        "transfer",
        REWRITE,
        "        if annotated is message:  # (forwarded: it has them already)",
        "        if annotated is message and not where:  # (forwarded: it has them already)",
        "The rewrite keeps, for a forwarded message's annotations, a copy to splice in rather "
        "than 'as it is': every forwarded message is copied and read again on each router.",
        ROUTING_TESTS + "test_annotations.py::test_a_rewrite_kept_for_a_section_writes_what_the_first_one_wrote",
    ),
    M(
        "hop-limit-off-by-one",
        "transfer",
        RECEIVING,
        "        elif hops + 1 >= MAX_PATH:",
        "        elif hops + 1 > MAX_PATH:",
        "The transfer's hop check lets a message pass one router more than the limit before it "
        "goes to unroutable (a loop's net is one hop late).",
        NETWORK + "::test_a_message_that_passed_too_many_routers_goes_to_unroutable_where_it_reaches_the_limit",
    ),
    M(
        "forward-without-counting-the-hop",
        "transfer",
        RECEIVING,
        'return transaction.send(f"{queue}@{destination}", message, limited=not alone).delay_ms',
        'return transaction.send(f"{queue}@{destination}", Message(raw), limited=not alone).delay_ms',
        "A forwarded message goes on with the hop count it arrived with: a message in a routing "
        "loop never reaches the hop limit and circles for ever.",
        NETWORK + "::test_every_router_that_forwards_a_message_counts_its_hop",
    ),
    M(
        "nonxa-resend-not-in-doubt",
        "transfer",
        SENDING,
        "                if entry.redelivered or entry.id <= recovered",
        "                if entry.id <= recovered",
        "A non-XA batch sent again after its link was cut is not marked in doubt: the target's "
        "duplicate detection keeps the copies it already had (duplicates).",
        FAULTS + "::test_non_xa_each_doubt_state_on_purpose",
    ),
    M(
        "nonxa-recovered-not-in-doubt",
        "transfer",
        SENDING,
        "        recovered = max((entry.id for entry in queue.browse()), default=0)",
        "        recovered = 0",
        "Messages found in rt$R after a restart are sent over non-XA links without the doubt "
        "flag: the peer may have committed them before the crash (duplicates).",
        ROUTING_TESTS + "test_recovery.py::test_non_xa_what_rt_held_at_a_sigkill_goes_again_in_doubt",
    ),
    M(
        "receiver-ignores-doubt",
        "transfer",
        RECEIVING,
        "possible_duplicate=bool(doubt), limited=not alone",
        "possible_duplicate=False, limited=not alone",
        "The receiving router drops the doubt flag when it stages a message for its queue: the "
        "queue never checks a resend for a duplicate (duplicates).",
        FAULTS + "::test_non_xa_each_doubt_state_on_purpose",
    ),
    M(
        "recovery-commits-what-the-peer-never-had",
        "transfer",
        SENDING,
        "            commit = xid in listed_set\n",
        "            commit = True\n",
        "In recovery the sender commits every transaction it holds prepared, also those the peer "
        "does not list (never received): their messages leave rt$R and are lost.",
        FAULTS + "::test_xa_each_recovery_state_on_purpose",
    ),
    M(
        "recovery-tells-the-peer-nothing",
        "transfer",
        SENDING,
        "        link.machine.recovery_done(commit=list(listed))",
        "        link.machine.recovery_done(commit=[])",
        "The sender does not send COMMIT for the xids the peer listed: what the peer holds "
        "prepared stays in doubt there, never delivered.",
        FAULTS + "::test_xa_each_recovery_state_on_purpose",
    ),
    M(
        "recovered-commit-rolled-back",
        "transfer",
        RECEIVING,
        "        await self.manager.resolve_prepared(xid, commit=True)\n        write.finish(None)",
        "        await self.manager.resolve_prepared(xid, commit=False)\n        write.finish(None)",
        "A COMMIT for a transaction prepared by an earlier link is applied as a rollback at the "
        "receiver: the sender has committed (its copies are gone), so the messages are lost.",
        FAULTS + "::test_xa_each_recovery_state_on_purpose",
    ),
    M(
        "cut-link-keeps-nonxa-batches",
        "transfer",
        TRANSFER,
        "            for transaction in state.nonxa_out.values():\n                transaction.rollback_nowait()",
        "            for transaction in state.nonxa_out.values():\n                pass",
        "A cut link's unanswered non-XA batches are not rolled back: their messages stay held "
        "in rt$R and are never sent again (lost until a restart).",
        FAULTS + "::test_non_xa_each_doubt_state_on_purpose",
    ),
    M(
        "full-queue-refuses",
        "transfer",
        RECEIVING,
        "                if not state.waiting:\n                    state.waiting.append(batch)",
        "                if True:\n                    self._admitted(state, batch)\n"
        "                    batch.write.finish(exc)\n                    return\n"
        "                if not state.waiting:\n                    state.waiting.append(batch)",
        "A full target queue ends the inbound batch with an error instead of waiting for room: "
        "the link closes again and again under load (a full queue must hold the link back only).",
        LIMITS + "::test_a_full_queue_holds_the_link_back_until_it_has_room_and_nothing_is_lost",
    ),
]

# -- the link's stages and window --------------------------------------------------------------------

MUTANTS += [
    M(
        "recovery-done-before-its-commits",
        "stages",
        XARECOVERY,
        "if self._done_called and not self._done_sent and not core.sent.counts[Phase.COMMITTING]:",
        "if self._done_called and not self._done_sent:",
        "RECOVERY_DONE goes before the recovery COMMITs are answered: the peer enters delivery "
        "while transactions of the old link are still committing.",
        ROUTING_TESTS + "test_transfer.py::test_delivery_waits_for_the_slower_sides_commits",
        ROUTING_TESTS + "test_transfer.py::test_recovery_resolves_the_three_cases",
    ),
    M(
        "nonxa-sequence-may-repeat",
        "stages",
        DELIVERY,
        "        if frame.seq <= self._last_seq_in:",
        "        if frame.seq < self._last_seq_in:",
        "The receiver accepts a non-XA batch with the sequence number of the one before: a "
        "replayed batch is committed twice.",
        ROUTING_TESTS + "test_transfer.py::test_a_peers_non_xa_breach_closes_the_link",
    ),
    M(
        "window-ignores-bytes-in-flight",
        "stages",
        DELIVERY,
        "        if sent.awaiting_bytes >= peer.window_bytes or sent.open_bytes >= OPEN_FACTOR * peer.window_bytes:",
        "        if sent.open_bytes >= OPEN_FACTOR * peer.window_bytes:",
        "The sender's window forgets the receiver's inbound-window-bytes: a window of large "
        "messages overruns what the receiver accepts, and it closes the link.",
        ROUTING_TESTS + "test_transfer.py::test_the_peers_window_bytes_bound_what_awaits_and_what_is_open",
    ),
    M(
        "reflected-proof-accepted",
        "stages",
        HANDSHAKE,
        "        if not hmac.compare_digest(frame.proof, self._proof(LABEL_LISTENER)):",
        "        if not (\n"
        "            hmac.compare_digest(frame.proof, self._proof(LABEL_LISTENER))\n"
        "            or hmac.compare_digest(frame.proof, self._proof(LABEL_CONNECTOR))\n"
        "        ):",
        "The connector also accepts a listener's proof made with the connector's label: a fake "
        "listener that reflects the connector's own proof authenticates without the password.",
        ROUTING_TESTS + "test_stages.py::test_a_reflected_proof_is_refused_by_the_connector",
    ),
    M(
        "ledger-leaks-bytes-awaiting",
        "window",
        WINDOW,
        "        if current is self._awaiting_phase:\n            self.awaiting_bytes -= cost",
        "        if current is self._awaiting_phase:\n            pass",
        "An answered transaction's bytes stay counted as awaiting: the link's window closes for "
        "good after inbound-window-bytes have been sent (the link stalls).",
        ROUTING_TESTS + "test_transfer.py::test_the_peers_window_bytes_bound_what_awaits_and_what_is_open",
    ),
    M(
        "window-grows-when-not-limited",
        "window",
        WINDOW,
        "        if limited and rtt <= QUEUE_FACTOR * self.min_rtt + QUEUE_SLACK:",
        "        if rtt <= QUEUE_FACTOR * self.min_rtt + QUEUE_SLACK:",
        "The window grows on every timely answer, also when the sender did not fill it: an idle "
        "link's window grows without bound and a burst then overruns the receiver.",
        ROUTING_TESTS + "test_window.py::test_an_idle_sender_does_not_grow_the_window",
    ),
    M(
        "window-shrinks-below-its-start",
        "window",
        WINDOW,
        "                self._window = max(float(self.start), self._window * DECREASE)",
        "                self._window = self._window * DECREASE",
        "A queueing round shrinks the window below the receiver's inbound-window-size: the link "
        "becomes slower than the fixed window of earlier versions.",
        ROUTING_TESTS + "test_window.py",
    ),
    M(
        "stall-keeps-the-window",
        "window",
        WINDOW,
        "        self.threshold = max(float(self.start), self._window / 2)\n        self._window = float(self.start)",
        "        self.threshold = max(float(self.start), self._window / 2)",
        "A receiver that stopped answering does not send the window back to its start: when it "
        "answers again the sender bursts a grown window into it.",
        ROUTING_TESTS + "test_window.py::test_a_silent_receiver_sends_the_window_back_to_its_start_and_it_grows_again",
    ),
]

# -- route exchange ------------------------------------------------------------------------------------

MUTANTS += [
    M(
        "route-hop-limit-off-by-one",
        "exchange",
        EXCHANGE,
        "    if 0 < hop_limit <= len(path):",
        "    if 0 < hop_limit < len(path):",
        "route-announce-hop-limit announces routes one hop longer than the limit.",
        ROUTING_TESTS + "test_exchange.py",
        "-k",
        "output_rule or hop_limit or five_chain",
    ),
    M(
        "route-announced-through-a-router-on-its-path",
        "exchange",
        EXCHANGE,
        '    if neighbour in path:\n        return "on its path"',
        '    if neighbour == path[-1]:\n        return "on its path"',
        "Loop prevention checks only the destination: a route is announced to a neighbour in "
        "its middle, which learns a looping route.",
        ROUTING_TESTS + "test_exchange.py",
    ),
    M(
        "route-not-withdrawn",
        "exchange",
        EXCHANGE,
        "        for neighbour, announced in self._announced.items():\n            if path in announced:\n"
        "                self._withdraw(neighbour, path)",
        "        for neighbour, announced in self._announced.items():\n            if path in announced:\n"
        "                pass",
        "A route that goes is not withdrawn from the neighbours it was announced to: they keep "
        "sending over a path that no longer exists.",
        ROUTING_TESTS + "test_exchange.py::test_link_down_withdraws_what_was_learned_over_it_where_it_was_announced",
    ),
    M(
        "route-filter-tests-the-destination",
        "exchange",
        EXCHANGE,
        "    FilterType.INCLUDE_BY_HOP: (0, True),",
        "    FilterType.INCLUDE_BY_HOP: (-1, True),",
        "include_by_hop tests a route's destination instead of its next hop.",
        ROUTING_TESTS + "test_exchange.py",
        "-k",
        "output_rule or filters",
    ),
    M(
        "route-order-oldest-first",
        "exchange",
        EXCHANGE,
        "key=lambda path: (len(path), -routes[path])",
        "key=lambda path: (len(path), routes[path])",
        "Among routes of equal length the oldest is used, not the newest (a route that came back "
        "after a flap is ignored while a stale one stays first).",
        ROUTING_TESTS + "test_exchange.py::test_routes_are_ordered_shortest_first_newest_first_among_equals",
    ),
    M(
        "route-through-self-accepted",
        "exchange",
        EXCHANGE,
        "        if len(set(path)) != len(path) or self.local in path:",
        "        if len(set(path)) != len(path):",
        "A route that passes through this router is accepted: the table holds a loop.",
        ROUTING_TESTS + "test_exchange.py",
    ),
]

# -- XA ------------------------------------------------------------------------------------------------------

XA = "swiftlets/xa/manager.py"
MUTANTS += [
    M(
        "claim-overlap-one-sided",
        "xa",
        XA,
        "                    if mine.startswith(theirs) or theirs.startswith(mine):",
        "                    if mine.startswith(theirs):",
        "A claim whose prefix is shorter than one claimed already (it covers the other owner's "
        "xids) is accepted: two owners resolve the same transactions.",
        T + "swiftlets/xa/test_xa.py::test_claims_hide_an_owners_xids_and_refuse_the_operator",
    ),
    M(
        "operator-resolves-a-claimed-xid",
        "xa",
        XA,
        "        if owner is not None:\n            raise Veto(",
        "        if owner is not None and False:\n            raise Veto(",
        "The operator may commit or roll back a transaction its owner (a routing link) is "
        "resolving: a heuristic decision against the recovery table.",
        T + "swiftlets/xa/test_xa.py::test_claims_hide_an_owners_xids_and_refuse_the_operator",
    ),
    M(
        "cut-link-keeps-its-claim",
        "xa",
        TRANSFER,
        "            if state.claim is not None:  # what is still prepared is in doubt until the peer is back\n"
        "                state.claim.release()",
        "            if state.claim is not None:  # what is still prepared is in doubt until the peer is back\n"
        "                pass",
        "A routing link that ends keeps its claim on its xids: what it left prepared never shows "
        "in sys$xa's in-doubt list, so the operator cannot resolve it when the peer is gone for good.",
        ROUTING_TESTS + "test_recovery.py::test_the_operator_resolves_a_routing_xid_whose_peer_never_comes_back",
    ),
    M(
        "rollback-operation-commits",
        "xa",
        XA,
        "        async def rollback() -> None:\n            await self._operate(xid, commit=False)",
        "        async def rollback() -> None:\n            await self._operate(xid, commit=True)",
        "The in-doubt list's rollback operation commits the transaction.",
        T + "swiftlets/xa/test_xa.py::test_restart_warns_lists_and_the_operator_commits_and_rolls_back",
    ),
]

# -- topic federation ------------------------------------------------------------------------------

FEDERATION = "swiftlets/topicmanager/federation.py"
FORWARDED = "swiftlets/topicmanager/forwarded.py"
MUTANTS += [
    M(
        "interest-record-order-ignores-epoch",
        "topics",
        FEDERATION,
        "self._newest.get(record.router, (-1, -1)) >= (record.epoch, record.seq)",
        "self._newest.get(record.router, (-1, -1))[1] >= record.seq",
        "Interest records are ordered by sequence number alone: the records of a restarted "
        "router (a new epoch, counting from 1 again) are ignored as old.",
        TOPIC_TESTS + "test_federation.py::test_the_newest_record_of_a_router_is_its_whole_interest",
    ),
    M(
        "keep-on-unsubscribe-ignored",
        "topics",
        FEDERATION,
        "                if not subscription.keep:\n                    del subscriptions[root]",
        "                del subscriptions[root]",
        "A static remote subscription with keep-on-unsubscribe ends when its router stops "
        "announcing the root: what is published meanwhile never reaches its durable subscribers.",
        TOPIC_TESTS + "test_federation.py::test_static_subscriptions_end_with_the_first_record_unless_kept",
    ),
    M(
        "no-local-forgets-the-publisher",
        "topics",
        "swiftlets/topicmanager/manager.py",
        "message, publisher if isinstance(publisher, str) else None\n",
        "message, None\n",
        "No-local is not applied to publications forwarded by another router: a no-local "
        "subscriber receives its own client's messages published on another router.",
        TOPIC_TESTS + "test_network.py::test_no_local_uses_the_original_publishers_client_id",
    ),
    M(
        "forwarded-acknowledged-outside-the-transaction",
        "topics",
        FORWARDED,
        "                    self._deliver(entry.message, transaction)\n"
        "                    transaction.acknowledge(consumer, entry)",
        "                    self._deliver(entry.message, transaction)\n                    consumer.accept(entry)",
        "A forwarded persistent publication is acknowledged at once instead of in the "
        "transaction that delivers it: a crash (or a failed commit) between the two loses it "
        "for every subscriber of this router.",
        TOPIC_TESTS
        + "test_network.py::test_a_forwarded_publication_leaves_tpc_only_with_the_transaction_that_delivers_it",
    ),
    M(
        "orderly-stop-withdraws-durable-interest",
        "topics",
        FEDERATION,
        "            self._announce(router, durable_only=True)",
        "            self._send_record(router, frozenset())",
        "A router that stops orderly withdraws all its interest (as SwiftMQ's federated topic managers do): what is "
        "published while it is down never reaches its durable subscribers.",
        TOPIC_TESTS + "test_network.py::test_an_orderly_stop_tells_the_neighbours_that_only_durable_interest_stays",
        TOPIC_TESTS + "test_network.py::test_an_orderly_stop_keeps_durable_interest_without_keep_on_unsubscribe",
    ),
    M(
        "orderly-stop-record-left-behind",
        "topics",
        "swiftlets/routing/swiftlet.py",
        "                self.context.before_stop(self._last_transfers)",
        "                pass  # the links close at once",
        "Routing stops without letting its links carry what waits: a stopping router's last "
        "interest record never reaches its neighbours, which go on forwarding to roots only its "
        "gone non-durable subscribers wanted.",
        TOPIC_TESTS + "test_network.py::test_an_orderly_stop_tells_the_neighbours_that_only_durable_interest_stays",
    ),
]

# -- queue manager transactions ----------------------------------------------------------------------

QM = "swiftlets/queuemanager/transactions.py"
QUEUE = "swiftlets/queuemanager/state.py"
MUTANTS += [
    M(
        "rollback-redelivery-not-counted",
        "queuemanager",
        QM,
        "                queue.release(entry, count_delivery=True)",
        "                queue.release(entry, count_delivery=False)",
        "A rolled-back acknowledgement gives its message back without counting the failed "
        "delivery: it is not marked redelivered (JMSRedelivered; routing's doubt flag) and "
        "max-delivery-count never sends a poison message to routerdlq.",
        QUEUE_TESTS + "test_queues.py::test_rollback_redelivers_and_drops_sends",
    ),
    M(
        "commit-keeps-acknowledged-in-store",
        "queuemanager",
        QM,
        "        ops.extend(DeleteMessage(entry.id) for _, entry in self._acks if entry.persistent)\n"
        "        if not ops:",
        "        if not ops:",
        "A committed transaction removes its acknowledged persistent messages from memory but "
        "not from the store: they come back after a restart (duplicates).",
        QUEUE_TESTS + "test_queues.py::test_prepared_transactions_survive_a_restart",
        QUEUE_TESTS + "test_queues.py::test_transaction_spanning_queues_commits_together",
    ),
    M(
        "prepared-commit-keeps-the-txid",
        "queuemanager",
        QM,
        "            ops.extend(SetTransaction(entry.id, None) for _, entry in self._sends if entry.persistent)\n",
        "",
        "Committing a prepared transaction deletes its prepare record but leaves its sends "
        "tagged with the xid: at the next start they are prepared sends without a record, and "
        "are deleted (lost).",
        QUEUE_TESTS + "test_queues.py::test_prepared_transactions_survive_a_restart",
    ),
    M(
        "prepared-rollback-keeps-the-record",
        "queuemanager",
        QM,
        '            ops.append(DeleteRecord("xa", self.xid or ""))\n            assert manager._store is not None\n'
        '            self.state = "rolling-back"',
        '            assert manager._store is not None\n            self.state = "rolling-back"',
        "Rolling back a prepared transaction leaves its prepare record: after a restart it is "
        "prepared again and holds its acknowledged messages (which were redelivered already).",
        QUEUE_TESTS + "test_queues.py::test_prepared_transactions_survive_a_restart",
        T + "swiftlets/xa/test_xa.py::test_restart_warns_lists_and_the_operator_commits_and_rolls_back",
    ),
    M(
        "reservations-not-counted",
        "queuemanager",
        QUEUE,
        "        if self.size + self.reserved + extra > settings.max_messages >= 0:",
        "        if self.size + extra > settings.max_messages >= 0:",
        "max-messages ignores what prepared and committing transactions will add: two prepared "
        "batches overfill the queue.",
        QUEUE_TESTS
        + "test_queues.py::test_what_prepared_and_committing_transactions_will_add_counts_against_the_limits",
    ),
    M(
        "doubt-flag-ignored-by-the-queue",
        "queuemanager",
        QUEUE,
        '        if possible_duplicate or self.settings.duplicate_check == "always":',
        '        if self.settings.duplicate_check == "always":',
        "A queue checks a message in doubt for a duplicate only with duplicate-check always: "
        "non-XA resends are kept twice.",
        QUEUE_TESTS + "test_queues.py::test_duplicates_are_dropped_when_in_doubt",
    ),
    M(
        "staged-sends-not-counted",
        "queuemanager",
        QM,
        "            queue.check_room(staged[0] + 1, staged[1] + len(message.raw))",
        "            queue.check_room(1, len(message.raw))",
        "A transaction's room check counts only the message it stages, not those it staged "
        "before: one transaction overfills max-messages.",
        QUEUE_TESTS
        + "test_queues.py::test_what_prepared_and_committing_transactions_will_add_counts_against_the_limits",
        LIMITS + "::test_a_full_queue_holds_the_link_back_until_it_has_room_and_nothing_is_lost",
    ),
]

# -- store recovery ------------------------------------------------------------------------------------

MUTANTS += [
    M(
        "recovery-drops-prepared-sends",
        "store",
        "swiftlets/store/dbprocess.py",
        '"SELECT id, queue, body, delivery_count, txid FROM messages ORDER BY id"',
        '"SELECT id, queue, body, delivery_count, txid FROM messages WHERE txid IS NULL ORDER BY id"',
        "The store's recovery skips the sends of prepared transactions: a prepared transaction "
        "committed after a restart delivers nothing (lost).",
        QUEUE_TESTS + "test_queues.py::test_prepared_transactions_survive_a_restart",
    ),
    M(
        "recovery-reuses-the-last-id",
        "store",
        "swiftlets/store/dbprocess.py",
        '        send(["ready", last_id + 1])',
        '        send(["ready", last_id])',
        "After a restart the first new message gets the id of the last stored one: its insert "
        "replaces or collides with a stored message.",
        T + "swiftlets/store/test_store.py::test_everything_committed_is_recovered",
        QUEUE_TESTS + "test_queues.py::test_persistent_messages_survive_a_restart",
    ),
    M(
        "recovery-releases-held-messages",
        "store",
        "swiftlets/queuemanager/recovery.py",
        "            elif stored.id in held:",
        "            elif stored.id in held and False:",
        "A message acknowledged by a prepared transaction is recovered as available: it is "
        "delivered again, and the transaction's commit removes it later (duplicates).",
        QUEUE_TESTS + "test_queues.py::test_prepared_transactions_survive_a_restart",
    ),
    M(
        "remembered-ids-one-short",
        "store",
        "swiftlets/store/dbprocess.py",
        "                        (queue_name, size),",
        "                        (queue_name, size - 1),",
        "The store keeps one duplicate-detection id fewer than the backlog size: after a "
        "restart the oldest remembered id is forgotten (a duplicate passes).",
        T + "swiftlets/store/test_store.py::test_remembered_ids_keep_only_the_newest",
    ),
    M(
        "same-batch-update-lost",
        "store",
        "swiftlets/store/dbprocess.py",
        "                if put is not None:  # stored in this batch: store it changed\n"
        "                    put[field] = op[2]",
        "                if put is not None:  # stored in this batch: store it changed\n                    pass",
        "A change to a message stored in the same group commit (a prepare and its commit "
        "batched together clear the txid) is dropped: the message keeps its xid and is "
        "deleted as an orphan at the next start.",
        T + "swiftlets/store/test_store.py::test_updates_of_one_batch_go_by_value_and_the_last_one_wins",
        T + "swiftlets/store/test_store.py::test_a_message_body_is_replaced_stored_or_in_the_same_batch",
    ),
]

# -- selectors ---------------------------------------------------------------------------------------------

SELECTOR = "messaging/selector.py"
SELECTORS = T + "messaging/test_selector.py"
MUTANTS += [
    M(
        "null-comparison-is-false",
        "selectors",
        SELECTOR,
        "def _compare(op: str, left: Any, right: Any) -> bool | None:\n    if left is None or right is None:\n"
        "        return None",
        "def _compare(op: str, left: Any, right: Any) -> bool | None:\n    if left is None or right is None:\n"
        "        return False",
        "A comparison with NULL is FALSE instead of UNKNOWN: NOT (a = 1) selects messages without a.",
        SELECTORS,
    ),
    M(
        "false-and-unknown-is-unknown",
        "selectors",
        SELECTOR,
        "    if left is False or right is False:\n        return False\n    if left is None or right is None:\n"
        "        return None",
        "    if left is None or right is None:\n        return None\n    if left is False or right is False:\n"
        "        return False",
        "FALSE AND UNKNOWN is UNKNOWN instead of FALSE: NOT (b = 1 AND a = 1) misses messages without a.",
        SELECTORS,
    ),
    M(
        "not-between-null-is-true",
        "selectors",
        SELECTOR,
        "            return _not(result) if negated else result",
        "            return (not result) if negated else result",
        "NOT BETWEEN of a NULL value is TRUE instead of UNKNOWN.",
        SELECTORS,
    ),
    M(
        "integer-division-floors",
        "selectors",
        SELECTOR,
        "        quotient = abs(a) // abs(b)  # Java long division truncates toward zero\n"
        "        return quotient if (a >= 0) == (b >= 0) else -quotient",
        "        return a // b",
        "Integer division floors as Python's // does, not truncate toward zero as Java's: -7 / 2 is -4, not -3.",
        SELECTORS,
    ),
    M(
        "strings-ordered",
        "selectors",
        SELECTOR,
        '    if kind != "number":\n        return False\n    if op == "<":',
        '    if op == "<":',
        "Strings compare with < and >, which JMS selectors do not allow (only = and <>).",
        SELECTORS,
    ),
    M(
        "like-head-and-tail-overlap",
        "selectors",
        "messaging/like.py",
        "        if end < head.length or not head.at(text, 0) or not tail.at(text, end):",
        "        if not head.at(text, 0) or not tail.at(text, end):",
        "LIKE lets the text before the first % and after the last one overlap: 'ab%ba' matches 'aba'.",
        T + "messaging/test_like.py",
    ),
]

# -- management roles ------------------------------------------------------------------------------------

MGMT = "swiftlets/mgmt/requests.py"
MUTANTS += [
    M(
        "router-identity-may-write",
        "mgmt",
        MGMT,
        "    if identity.internal:  # a router's own request: routers are trusted (see .api), for reading only\n"
        "        role = Role.READ_ONLY",
        "    if identity.internal:  # a router's own request: routers are trusted (see .api), for reading only\n"
        "        role = Role.READ_WRITE",
        "A router's own identity (sys$web reading other routers) gets read-write rights: a web "
        "view may halt any router of the network.",
        T + "swiftlets/mgmt/test_service.py::test_the_authorization_decision",
    ),
    M(
        "unknown-group-read-only",
        "mgmt",
        MGMT,
        "        granted = groups.get(identity.group)\n",
        "        granted = groups.get(identity.group, Role.READ_ONLY)\n",
        "With authentication on, a user of a group sys$mgmt does not list is given the "
        "read-only role instead of being refused.",
        T + "swiftlets/mgmt/test_service.py::test_the_authorization_decision",
        T + "swiftlets/mgmt/test_service.py::test_roles_with_authentication",
    ),
    M(
        "unauthenticated-user-trusted",
        "mgmt",
        MGMT,
        "        if not identity.authenticated:\n            raise Refused(",
        "        if not identity.authenticated and not identity.user:\n            raise Refused(",
        "With authentication on, a request whose user name the entry router did not "
        "authenticate is trusted when it names a user.",
        T + "swiftlets/mgmt/test_service.py::test_the_authorization_decision",
        T + "swiftlets/mgmt/test_service.py::test_roles_with_authentication",
    ),
    M(
        "read-only-may-invoke",
        "mgmt",
        "swiftlets/mgmt/api.py",
        'WRITE_VERBS = frozenset({"set", "add", "remove", "invoke", "save", "reboot", "halt"})',
        'WRITE_VERBS = frozenset({"set", "add", "remove", "save", "reboot", "halt"})',
        "invoke (operations such as purge, delete or an XA rollback) is not a write: a read-only "
        "group may destroy messages.",
        T + "swiftlets/mgmt/test_service.py::test_the_authorization_decision",
        T + "swiftlets/mgmt/test_service.py::test_roles_with_authentication",
    ),
    M(
        "client-identity-trusted",
        "mgmt",
        "swiftlets/jms/listener.py",
        "        return message.with_annotations({IDENTITY_ANNOTATION: identity.annotation()})",
        "        if IDENTITY_ANNOTATION in message.message_annotations:\n            return message\n"
        "        return message.with_annotations({IDENTITY_ANNOTATION: identity.annotation()})",
        "The listener keeps an identity a client put into its request instead of replacing it: "
        "any client can claim to be an authenticated administrator.",
        T + "swiftlets/mgmt/test_service.py::test_without_authentication_only_local_clients_are_answered",
    ),
]

# -- scheduler -------------------------------------------------------------------------------------------------

TIMING = "swiftlets/scheduler/timing.py"
SCHEDULER = T + "swiftlets/scheduler/test_timing.py"
MUTANTS += [
    M(
        "last-day-of-month-wrong",
        "scheduler",
        TIMING,
        "(self.last_day and day.day == _calendar.monthrange(day.year, day.month)[1])",
        "(self.last_day and day.day == _calendar.monthrange(day.year, day.month)[1] - 1)",
        "A calendar's 'last' day of the month is the day before the last.",
        SCHEDULER,
    ),
    M(
        "date-range-end-excluded",
        "scheduler",
        TIMING,
        "            or any(first <= day <= last for first, last in self.date_ranges)",
        "            or any(first <= day < last for first, last in self.date_ranges)",
        "A calendar's date range leaves out its last day (documented as included).",
        SCHEDULER,
    ),
    M(
        "window-start-at-its-close",
        "scheduler",
        TIMING,
        "        count = -(-self.length // self.delay)",
        "        count = self.length // self.delay + 1",
        "A window also starts at the moment it closes when the delay divides its length.",
        SCHEDULER,
    ),
    M(
        "yesterdays-window-forgotten",
        "scheduler",
        TIMING,
        "    day = after.date() - timedelta(days=1)  # yesterday's window may still be open",
        "    day = after.date()",
        "The next start ignores yesterday's window still open after midnight: the starts of a "
        "window that wraps past midnight after 00:00 are skipped.",
        SCHEDULER,
    ),
    M(
        "sunday-is-monday",
        "scheduler",
        TIMING,
        'WEEKDAYS = {"sun": 6, "mon": 0,',
        'WEEKDAYS = {"sun": 0, "mon": 0,',
        "'sun' in a calendar means Monday (Sunday first in SwiftMQ's order, 0 in Python's).",
        SCHEDULER,
    ),
]

# -- the live Spark source ------------------------------------------------------------------------------

SOURCE = "pipeline/source.py"
LIVE = T + "pipeline/test_source_kills.py::test_the_live_source_delivers_every_row_once_across_kills_at_each_point"
MUTANTS += [
    M(
        "source-acknowledges-uncommitted",
        "spark",
        SOURCE,
        "            if any(key > committed.get(router, NOTHING) for router, key in message.marks.items()):\n"
        "                break\n",
        "",
        "commit() acknowledges every message received, also those of a batch Spark has not "
        "committed yet: a crash then loses that batch's rows.",
        T + "pipeline/test_source.py",
        LIVE,
    ),
    # (No mutant of the row bounds a part file is read within: a part holds only the messages
    # whose rows its batch took, so a bound off by one changes nothing alone; they guard
    # against a message taken twice, which the batch's own selection already excludes.)
    M(
        "source-replay-not-kept",
        "spark",
        SOURCE,
        "        write_batch(self.replay, start, end, self._split(fresh))\n",
        "",
        "A batch is not stored for its replay before Spark logs its end: a restarted query that "
        "must replay it (or an executor that reads it) finds no parts ('cannot replay the batch').",
        T + "pipeline/test_source.py",
        LIVE,
    ),
]


# -- the harness -------------------------------------------------------------------------------

GUARD = '''\
"""Loaded with -p by bench/mutants.py: refuse to test anything but the mutated copy."""

import importlib
import os
from pathlib import Path

import pytest


def pytest_configure(config):
    root = Path(os.environ["MARTINET_MUTANT_ROOT"]).resolve()
    module = os.environ.get("MARTINET_MUTANT_MODULE", "")
    replacement = os.environ.get("MARTINET_MUTANT_REPLACEMENT", "")
    problems = []
    for name in ("martinet.kernel", "martinet.messaging", "martinet.swiftlets", "martinet.pipeline", module):
        if not name:
            continue
        loaded = importlib.import_module(name)
        where = Path(loaded.__file__).resolve()
        if not where.is_relative_to(root):
            problems.append(f"{name} is imported from {where}, not from the copy {root}")
        elif name == module and replacement not in where.read_text():
            problems.append(f"{name} ({where}) does not hold the mutant")
    if problems:
        pytest.exit("mutants: " + "; ".join(problems), returncode=99)
'''


@dataclass
class Result:
    mutant: Mutant
    outcome: str  # caught, survived, does not apply, timeout, error
    seconds: float
    detail: str = ""  # the first failing test, or what went wrong
    log: str = ""


def tracked_files() -> list[str]:
    listed = subprocess.run(
        ["git", "ls-files", "-z"], cwd=ROOT, capture_output=True, check=True, text=True
    ).stdout.split("\0")
    return [name for name in listed if name and (ROOT / name).is_file()]


def package_dirs() -> dict[str, str]:
    """``martinet.kernel`` → ``kernel`` …: pyproject's package-dir (the installed names)."""
    with open(ROOT / "pyproject.toml", "rb") as file:
        return tomllib.load(file)["tool"]["setuptools"]["package-dir"]


def module_name(file: str, packages: dict[str, str]) -> str:
    """The importable name of a file of the repository (``swiftlets/xa/api.py`` →
    ``martinet.swiftlets.xa.api``), the longest mapped folder first."""
    path = Path(file).with_suffix("")
    for package, folder in sorted(packages.items(), key=lambda item: -len(item[1])):
        if path.is_relative_to(folder):
            rest = path.relative_to(folder).parts
            if rest and rest[-1] == "__init__":
                rest = rest[:-1]
            return ".".join((package, *rest))
    raise ValueError(f"{file} is not in an installed package")


def make_copy(base: Path, files: list[str], packages: dict[str, str]) -> tuple[Path, Path]:
    """The tracked files in ``base/repo`` and a link tree of the ``martinet`` packages of that
    copy in ``base/site`` (as setuptools' strict editable install makes of the checkout)."""
    repo, site = base / "repo", base / "site"
    for name in files:
        target = repo / name
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(ROOT / name, target)
    for package, folder in packages.items():
        destination = site.joinpath(*package.split("."))
        for source in (repo / folder).rglob("*"):
            if source.is_file() and "__pycache__" not in source.parts:
                link = destination / source.relative_to(repo / folder)
                link.parent.mkdir(parents=True, exist_ok=True)
                link.symlink_to(source)
    (site / "_martinet_mutant_guard.py").write_text(GUARD)
    return repo, site


def apply(mutant: Mutant, repo: Path) -> str | None:
    """Patch the copy; the reason when the snippet is not there exactly once."""
    path = repo / mutant.file
    if not path.is_file():
        return f"{mutant.file} does not exist"
    text = path.read_text()
    found = text.count(mutant.original)
    if found != 1:
        return f"the snippet occurs {found} times in {mutant.file}"
    path.write_text(text.replace(mutant.original, mutant.replacement))
    return None


_procs: set[subprocess.Popen] = set()
_procs_lock = threading.Lock()


def run_pytest(args: list[str], cwd: Path, env: dict[str, str], timeout: float) -> tuple[int | None, str]:
    """pytest in its own process group (the routers and store processes the tests start
    go with it on a timeout); (exit code or None on a timeout, output)."""
    with tempfile.TemporaryFile("w+") as output:
        process = subprocess.Popen(
            [sys.executable, "-m", "pytest", *args],
            cwd=cwd,
            env=env,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
        with _procs_lock:
            _procs.add(process)
        try:
            code: int | None = process.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            code = None
        finally:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.killpg(process.pid, signal.SIGKILL)  # what the tests left running, too
            process.wait()
            with _procs_lock:
                _procs.discard(process)
        output.seek(0)
        return code, output.read()


def first_failure(log: str) -> str:
    match = re.search(r"^(?:FAILED|ERROR) (\S+)", log, re.MULTILINE)
    return match[1] if match else ""


def run_mutant(
    mutant: Mutant, files: list[str], packages: dict[str, str], timeout: float, keep: bool, unmutated: bool
) -> Result:
    began = time.monotonic()
    base = Path(tempfile.mkdtemp(prefix=f"martinet-mutant-{mutant.name}-"))
    try:
        repo, site = make_copy(base, files, packages)
        problem = apply(mutant, repo)
        if problem is not None:
            return Result(mutant, "does not apply", time.monotonic() - began, problem)
        if unmutated:  # the selection on the code as it is: it must pass
            (repo / mutant.file).write_text((ROOT / mutant.file).read_text())
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(filter(None, [str(site), env.get("PYTHONPATH", "")]))
        env["MARTINET_MUTANT_ROOT"] = str(base)
        env["MARTINET_MUTANT_MODULE"] = module_name(mutant.file, packages)
        env["MARTINET_MUTANT_REPLACEMENT"] = mutant.original if unmutated else mutant.replacement
        env.pop("PYTEST_ADDOPTS", None)
        args = ["-p", "_martinet_mutant_guard", "-p", "no:cacheprovider", "-x", "-q", "-rfE", *mutant.tests]
        code, log = run_pytest(args, repo, env, timeout)
        seconds = time.monotonic() - began
        if code is None:
            return Result(mutant, "timeout", seconds, f"no verdict in {timeout:g} s", log)
        if code == PASSED:
            summary = log.strip().splitlines()[-1:] or [""]
            if " passed" not in summary[0]:  # every test skipped itself (a tool or an address missing)
                return Result(mutant, "skipped", seconds, summary[0].strip("= ")[:150], log)
            return Result(mutant, "passed" if unmutated else "survived", seconds, "", log)
        collecting = re.search(r"^ERROR collecting (\S+)", log, re.MULTILINE)
        if code == FAILED or collecting:  # (a test module that cannot even be imported is red too)
            failure = first_failure(log) if code == FAILED else f"{collecting[1]} (collection)"
            return Result(mutant, "failed" if unmutated else "caught", seconds, failure, log)
        last = log.strip().splitlines()[-1:] or [""]
        return Result(mutant, "error", seconds, f"pytest exit {code}: {last[0][:150]}", log)
    finally:
        if keep:
            print(f"  (kept {base})", file=sys.stderr)
        else:
            remove(base)


def remove(base: Path) -> None:
    """Delete a copy; again after a moment if a process that was killed still wrote into it."""
    for _ in range(3):
        shutil.rmtree(base, ignore_errors=True)
        if not base.exists():
            return
        time.sleep(1)


def check_the_copy(files: list[str], packages: dict[str, str]) -> None:
    """Once, before anything: a child process with the copy first on PYTHONPATH imports the
    copy (the editable install of the checkout must not win), or nothing runs."""
    base = Path(tempfile.mkdtemp(prefix="martinet-mutant-check-"))
    try:
        _, site = make_copy(base, files, packages)
        env = dict(os.environ, PYTHONPATH=str(site))
        names = [*packages, "martinet.swiftlets.routing.transfer"]
        script = "import importlib, sys\nfor n in sys.argv[1:]: print(importlib.import_module(n).__file__)"
        found = subprocess.run(
            [sys.executable, "-c", script, *names], env=env, capture_output=True, text=True, cwd=base
        )
        wrong = [line for line in found.stdout.splitlines() if not Path(line).is_relative_to(base)]
        if found.returncode or wrong:
            sys.exit(f"mutants: the copy is not what gets imported: {wrong or found.stderr.strip()}")
    finally:
        remove(base)


def table(results: list[Result]) -> str:
    rows = [("mutant", "area", "outcome", "seconds", "caught by / why")]
    for result in results:
        detail = result.detail.removeprefix("tests/")
        rows.append((result.mutant.name, result.mutant.area, result.outcome, f"{result.seconds:.0f}", detail))
    widths = [max(len(row[i]) for row in rows) for i in range(4)]
    lines = []
    for index, row in enumerate(rows):
        lines.append("  ".join(cell.ljust(width) for cell, width in zip(row[:4], widths, strict=True)) + "  " + row[4])
        if index == 0:
            lines.append("  ".join("-" * width for width in widths) + "  " + "-" * 15)
    return "\n".join(line.rstrip() for line in lines)


def main() -> int:
    parser = argparse.ArgumentParser(
        description=__doc__.split("\n\n")[0], formatter_class=argparse.RawTextHelpFormatter
    )
    parser.add_argument("--list", action="store_true", help="list the mutants and their tests, run nothing")
    parser.add_argument("--only", help="comma-separated mutant names")
    parser.add_argument("--area", help="only the mutants of this area")
    parser.add_argument("--jobs", type=int, default=1, help="mutants run at once (default 1)")
    parser.add_argument("--timeout", type=float, default=600, help="seconds per mutant (default 600)")
    parser.add_argument("--keep", action="store_true", help="keep each temporary copy (its path is printed)")
    parser.add_argument("--logs", type=Path, help="write each mutant's pytest output to this folder")
    parser.add_argument(
        "--unmutated", action="store_true", help="run the selections on unpatched copies: all must pass"
    )
    options = parser.parse_args()

    names = {mutant.name for mutant in MUTANTS}
    assert len(names) == len(MUTANTS), "two mutants share a name"
    chosen = MUTANTS
    if options.only:
        wanted = [name.strip() for name in options.only.split(",") if name.strip()]
        unknown = [name for name in wanted if name not in names]
        if unknown:
            parser.error(f"unknown mutant(s): {', '.join(unknown)}")
        chosen = [mutant for mutant in chosen if mutant.name in wanted]
    if options.area:
        areas = sorted({mutant.area for mutant in MUTANTS})
        if options.area not in areas:
            parser.error(f"unknown area {options.area!r}; one of {', '.join(areas)}")
        chosen = [mutant for mutant in chosen if mutant.area == options.area]
    if options.list:
        for mutant in chosen:
            path = ROOT / mutant.file
            found = path.read_text().count(mutant.original) if path.is_file() else 0
            applies = "" if found == 1 else f"  DOES NOT APPLY (found {found} times)"
            print(f"{mutant.name}  [{mutant.area}]  {mutant.file}{applies}")
            print(textwrap.indent(textwrap.fill(mutant.description, 100), "    "))
            print(f"    tests: {shlex.join(mutant.tests)}")
        print(f"{len(chosen)} mutants")
        return 0

    files = tracked_files()
    packages = package_dirs()
    check_the_copy(files, packages)
    began = time.monotonic()
    results: list[Result] = []
    print(f"{len(chosen)} mutants, {options.jobs} at a time, at most {options.timeout:g} s each", flush=True)
    with concurrent.futures.ThreadPoolExecutor(max_workers=max(1, options.jobs)) as pool:
        futures = {
            pool.submit(run_mutant, mutant, files, packages, options.timeout, options.keep, options.unmutated): mutant
            for mutant in chosen
        }
        try:
            for future in concurrent.futures.as_completed(futures):
                result = future.result()
                results.append(result)
                print(f"  {result.mutant.name}: {result.outcome} in {result.seconds:.0f} s {result.detail}", flush=True)
                if options.logs is not None:
                    options.logs.mkdir(parents=True, exist_ok=True)
                    (options.logs / f"{result.mutant.name}.log").write_text(result.log)
        except KeyboardInterrupt:
            for future in futures:
                future.cancel()
            with _procs_lock:
                for process in _procs:
                    with contextlib.suppress(ProcessLookupError, PermissionError):
                        os.killpg(process.pid, signal.SIGKILL)
            raise
    order = {mutant.name: index for index, mutant in enumerate(MUTANTS)}
    results.sort(key=lambda result: order[result.mutant.name])
    print()
    print(table(results))
    counts: dict[str, int] = {}
    for result in results:
        counts[result.outcome] = counts.get(result.outcome, 0) + 1
    total = time.monotonic() - began
    print()
    print(", ".join(f"{count} {outcome}" for outcome, count in sorted(counts.items())) + f"; {total / 60:.1f} min")
    good = "passed" if options.unmutated else "caught"
    return 0 if all(result.outcome == good for result in results) else 1


if __name__ == "__main__":
    sys.exit(main())
