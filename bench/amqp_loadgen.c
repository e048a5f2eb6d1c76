/* A small AMQP 1.0 load generator on proton's C proactor: one connection, one link.
 *
 *   amqp_loadgen send|recv HOST PORT ADDRESS COUNT [SIZE] [durable] [USER PASSWORD]
 *
 * send: COUNT messages of a SIZE-byte data section (default 100) on one unsettled link,
 *       as fast as credit allows; done when every one is accepted (at-least-once).
 * recv: receives COUNT messages with a credit window of 1000, accepting each.
 * Prints one line: "<mode> <count> <first-activity> <last> <rate>" with CLOCK_REALTIME
 * seconds, so a driver can combine a concurrent sender and receiver.
 * The message is encoded once and its bytes sent COUNT times (the load generator must
 * cost as little as possible per message). With LOADGEN_TEXT=1 in the environment the
 * bodies are text instead of one repeated byte: POOL different ones, of words drawn from a
 * small vocabulary by a fixed pseudo-random sequence (compressible as text is, and no two
 * of POOL consecutive messages alike), sent in turn. With LOADGEN_RATE=N the sender keeps
 * to N messages a second (no more sent than N times the seconds since its first send, the
 * rest on a 1 ms timer): CPU figures of two cases compare at one rate, so a router's costs
 * per second (its store's batches, timers) weigh the same per message in both.
 * Exit status 1 on any AMQP error.
 */
#include <proton/condition.h>
#include <proton/connection.h>
#include <proton/delivery.h>
#include <proton/link.h>
#include <proton/message.h>
#include <proton/proactor.h>
#include <proton/sasl.h>
#include <proton/session.h>
#include <proton/transport.h>

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define WINDOW 1000
#define POOL 64

typedef struct {
    bool sending;
    const char *address;
    long count, sent, done;
    char *encoded[POOL];
    size_t encoded_size[POOL];
    int pool;
    char *receive_buffer;
    size_t receive_size;
    double first, last;
    int status;
    double rate;          /* messages a second (0: as fast as credit allows) */
    pn_proactor_t *proactor;
    pn_link_t *link;      /* the sender's, once open */
    bool timer;           /* a timeout is set to send the next due messages */
} state_t;

static double now(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return ts.tv_sec + ts.tv_nsec / 1e9;
}

static void fail_on(pn_event_t *event, pn_condition_t *condition, state_t *state) {
    if (pn_condition_is_set(condition)) {
        fprintf(stderr, "%s: %s: %s\n", pn_event_type_name(pn_event_type(event)),
                pn_condition_get_name(condition), pn_condition_get_description(condition));
        state->status = 1;
        pn_connection_close(pn_event_connection(event));
    }
}

static const char *WORDS[] = {
    "the", "order", "of", "market", "price", "to", "and", "a", "in", "shipment", "customer", "paris", "tokyo",
    "quantity", "is", "for", "delivered", "status", "account", "with", "warehouse", "invoice", "pending", "was",
    "confirmed", "by", "payment", "received", "on", "item", "stock", "level", "below", "threshold", "route",
    "lyon", "carrier", "tracking", "number", "expected", "arrival", "date", "update", "from", "supplier", "net",
    "total", "amount", "currency", "euro", "yen", "discount", "applied", "returned", "damaged", "replacement"};

static void fill_text(char *body, size_t size, unsigned *seed) {
    size_t at = 0, words = sizeof WORDS / sizeof *WORDS;
    while (at < size) {
        *seed = *seed * 1103515245u + 12345u;
        const char *word = WORDS[(*seed >> 16) % words];
        for (const char *c = word; *c && at < size; c++) body[at++] = *c;
        if (at < size) body[at++] = ' ';
    }
}

static void encode_message(state_t *state, size_t size, bool durable) {
    bool text = getenv("LOADGEN_TEXT") && strcmp(getenv("LOADGEN_TEXT"), "1") == 0;
    unsigned seed = 1;
    state->pool = text ? POOL : 1;
    for (int n = 0; n < state->pool; n++) {
        pn_message_t *message = pn_message();
        char *body = malloc(size);
        if (text)
            fill_text(body, size, &seed);
        else
            memset(body, 'x', size);
        pn_message_set_durable(message, durable);
        pn_data_put_binary(pn_message_body(message), pn_bytes(size, body));
        pn_message_set_inferred(message, true); /* a data section, not an amqp-value */
        size_t capacity = size + 256;
        state->encoded[n] = malloc(capacity);
        if (pn_message_encode(message, state->encoded[n], &capacity)) {
            fprintf(stderr, "cannot encode the message\n");
            exit(1);
        }
        state->encoded_size[n] = capacity;
        pn_message_free(message);
        free(body);
    }
}

static void send_some(state_t *state, pn_link_t *link) {
    long due = state->count;
    if (state->rate > 0) {
        long paced = (long)((now() - state->first) * state->rate) + 1;
        if (paced < due) due = paced;
    }
    while (pn_link_credit(link) > 0 && state->sent < due) {
        long tag = ++state->sent;
        pn_delivery(link, pn_dtag((const char *)&tag, sizeof tag));
        pn_link_send(link, state->encoded[tag % state->pool], state->encoded_size[tag % state->pool]);
        pn_link_advance(link);
    }
    if (state->rate > 0 && state->sent < state->count && !state->timer) {
        state->timer = true;
        pn_proactor_set_timeout(state->proactor, 1);
    }
}

static void on_delivery(state_t *state, pn_delivery_t *delivery) {
    pn_link_t *link = pn_delivery_link(delivery);
    if (state->sending) {
        if (!pn_delivery_updated(delivery)) return;
        if (pn_delivery_remote_state(delivery) != PN_ACCEPTED) {
            fprintf(stderr, "message not accepted: state %lu\n", (unsigned long)pn_delivery_remote_state(delivery));
            state->status = 1;
        }
        pn_delivery_settle(delivery);
    } else {
        if (!pn_delivery_readable(delivery) || pn_delivery_partial(delivery)) return;
        size_t pending = pn_delivery_pending(delivery);
        if (pending > state->receive_size) {
            state->receive_size = pending;
            state->receive_buffer = realloc(state->receive_buffer, pending);
        }
        pn_link_recv(link, state->receive_buffer, pending);
        pn_link_advance(link);
        pn_delivery_update(delivery, PN_ACCEPTED);
        pn_delivery_settle(delivery);
        int credit = pn_link_credit(link);
        long wanted = state->count - state->done - 1 - credit;
        if (credit < WINDOW / 2 && wanted > 0) pn_link_flow(link, wanted < WINDOW - credit ? wanted : WINDOW - credit);
    }
    if (state->first == 0) state->first = now();
    if (++state->done == state->count || state->status) {
        state->last = now();
        state->link = NULL; /* (a timeout still set must not wake the closed connection) */
        pn_connection_close(pn_session_connection(pn_link_session(link)));
    }
}

static bool handle(state_t *state, pn_event_t *event) {
    switch (pn_event_type(event)) {
    case PN_CONNECTION_INIT: {
        pn_connection_t *connection = pn_event_connection(event);
        pn_connection_open(connection);
        pn_session_t *session = pn_session(connection);
        pn_session_open(session);
        pn_link_t *link;
        if (state->sending) {
            link = pn_sender(session, "loadgen-sender");
            pn_terminus_set_address(pn_link_target(link), state->address);
            pn_link_set_snd_settle_mode(link, PN_SND_UNSETTLED);
        } else {
            link = pn_receiver(session, "loadgen-receiver");
            pn_terminus_set_address(pn_link_source(link), state->address);
            pn_link_flow(link, state->count < WINDOW ? state->count : WINDOW);
        }
        pn_link_open(link);
        break;
    }
    case PN_LINK_FLOW:
        if (state->sending) {
            if (state->first == 0) state->first = now();
            state->link = pn_event_link(event);
            send_some(state, state->link);
        }
        break;
    case PN_PROACTOR_TIMEOUT: /* (outside the connection's events: it is woken to send) */
        state->timer = false;
        if (state->link) pn_connection_wake(pn_session_connection(pn_link_session(state->link)));
        break;
    case PN_CONNECTION_WAKE:
        if (state->link) send_some(state, state->link);
        break;
    case PN_DELIVERY:
        on_delivery(state, pn_event_delivery(event));
        break;
    case PN_TRANSPORT_CLOSED:
        state->link = NULL;
        fail_on(event, pn_transport_condition(pn_event_transport(event)), state);
        break;
    case PN_CONNECTION_REMOTE_CLOSE:
        fail_on(event, pn_connection_remote_condition(pn_event_connection(event)), state);
        pn_connection_close(pn_event_connection(event));
        break;
    case PN_LINK_REMOTE_CLOSE:
    case PN_LINK_REMOTE_DETACH:
        fail_on(event, pn_link_remote_condition(pn_event_link(event)), state);
        pn_connection_close(pn_event_connection(event));
        break;
    case PN_PROACTOR_INACTIVE:
        return false;
    default:
        break;
    }
    return true;
}

int main(int argc, char **argv) {
    if (argc < 6) {
        fprintf(stderr, "usage: %s send|recv HOST PORT ADDRESS COUNT [SIZE] [durable] [USER PASSWORD]\n", argv[0]);
        return 2;
    }
    state_t state = {0};
    state.sending = strcmp(argv[1], "send") == 0;
    state.address = argv[4];
    state.count = atol(argv[5]);
    encode_message(&state, argc > 6 ? (size_t)atol(argv[6]) : 100, argc > 7 && strcmp(argv[7], "durable") == 0);

    pn_connection_t *connection = pn_connection();
    pn_connection_set_container(connection, state.sending ? "loadgen-send" : "loadgen-recv");
    pn_transport_t *transport = pn_transport();
    if (argc > 9) {
        pn_connection_set_user(connection, argv[8]);
        pn_connection_set_password(connection, argv[9]);
        pn_sasl_set_allow_insecure_mechs(pn_sasl(transport), true);
        pn_sasl_allowed_mechs(pn_sasl(transport), "PLAIN");
    }
    char address[PN_MAX_ADDR];
    pn_proactor_t *proactor = state.proactor = pn_proactor();
    state.rate = getenv("LOADGEN_RATE") ? atof(getenv("LOADGEN_RATE")) : 0;
    pn_proactor_addr(address, sizeof address, argv[2], argv[3]);
    pn_proactor_connect2(proactor, connection, transport, address);
    for (bool running = true; running;) {
        pn_event_batch_t *events = pn_proactor_wait(proactor);
        for (pn_event_t *event; running && (event = pn_event_batch_next(events));) running = handle(&state, event);
        pn_proactor_done(proactor, events);
    }
    pn_proactor_free(proactor);
    if (state.done < state.count) {
        fprintf(stderr, "%s: only %ld of %ld messages\n", argv[1], state.done, state.count);
        state.status = 1;
    }
    double elapsed = state.last - state.first;
    printf("%s %ld %.6f %.6f %.0f\n", argv[1], state.done, state.first, state.last,
           elapsed > 0 ? state.done / elapsed : 0.0);
    for (int n = 0; n < state.pool; n++) free(state.encoded[n]);
    free(state.receive_buffer);
    return state.status;
}
