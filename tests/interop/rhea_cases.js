// rhea (the Node.js AMQP 1.0 library) in the situations that broke the router when rhea
// first met it, driven by tests/interop/test_rhea.py.
// Usage: node rhea_cases.js CASE PORT [ARG]. Each case prints one JSON line per step and
// exits 0, or prints {"event": "error", ...} and exits 1. Every wait is bounded (STEP_MS).
'use strict';

const rhea = require('rhea');

const [caseName, portText, arg] = process.argv.slice(2);
const port = Number(portText);
const STEP_MS = 15000;
const say = (event, fields) => console.log(JSON.stringify({event, ...fields}));

const failure = (text, condition) => Object.assign(new Error(text), {condition});

// Rejects `reject` when `connection` fails or goes; the returned function stops watching.
function watch(connection, reject) {
    const failed = (context) => reject(failure(`connection_error: ${JSON.stringify(context.connection.error)}`,
                                               context.connection.error && context.connection.error.condition));
    const gone = () => reject(failure('disconnected'));
    connection.on('connection_error', failed);
    connection.on('disconnected', gone);
    return () => {
        connection.removeListener('connection_error', failed);
        connection.removeListener('disconnected', gone);
    };
}

// Resolves with the first `name` event of `emitter` (a connection or a sender); rejects when
// the connection fails, or after STEP_MS.
function next(emitter, name, connection = emitter) {
    return new Promise((resolve, reject) => {
        const stop = watch(connection, reject);
        const timer = setTimeout(() => { stop(); reject(failure(`no ${name} within ${STEP_MS} ms`)); }, STEP_MS);
        emitter.once(name, (context) => { clearTimeout(timer); stop(); resolve(context); });
    });
}

// Resolves once the router answers `link`'s attach with a terminus; rejects with the
// condition of its refusal (an attach with a null terminus, then a detach with an error).
function opened(link, connection) {
    const kind = link.is_receiver() ? 'receiver' : 'sender';
    return new Promise((resolve, reject) => {
        const stop = watch(connection, reject);
        const timer = setTimeout(() => { stop(); reject(failure(`no ${kind}_open within ${STEP_MS} ms`)); }, STEP_MS);
        link.once(`${kind}_open`, () => {
            // A null terminus comes as rhea's typed null (which prints as null, but is an object).
            const terminus = kind === 'receiver' ? link.source : link.target;
            if (terminus && terminus.value !== null && terminus.value !== undefined) {  // else a refusal: its detach follows
                clearTimeout(timer);
                stop();
                resolve(link);
            }
        });
        link.once(`${kind}_error`, () => {
            clearTimeout(timer);
            stop();
            reject(failure(`${kind}_error: ${JSON.stringify(link.error)}`, link.error && link.error.condition));
        });
    });
}

// The condition of the error that refuses `link`'s attach.
function refusal(link, connection) {
    return opened(link, connection).then(
        () => { throw failure('the attach was not refused'); },
        (error) => error.condition);
}

// The bodies `receiver` gets until (and with) the one equal to `last`.
function bodiesUntil(receiver, last, connection) {
    return new Promise((resolve, reject) => {
        const bodies = [];
        const stop = watch(connection, reject);
        const timer = setTimeout(() => { stop(); reject(failure(`only ${JSON.stringify(bodies)} within ${STEP_MS} ms`)); },
                                 STEP_MS);
        receiver.on('message', (context) => {
            bodies.push(context.message.body);
            if (context.message.body === last) {
                clearTimeout(timer);
                stop();
                resolve(bodies);
            }
        });
    });
}

async function send(connection, address, bodies) {
    const sender = connection.open_sender(address);
    await opened(sender, connection);
    if (!sender.sendable()) await next(sender, 'sendable', connection);  // (the credit may have come with the attach)
    let accepted = 0;
    const all = new Promise((resolve) => sender.on('accepted', () => { if (++accepted === bodies.length) resolve(); }));
    for (const body of bodies) sender.send({body});
    await all;
    sender.close();
}

async function close(connection) {
    const closed = next(connection, 'connection_close');
    connection.close();
    await closed;
}

const connect = (container) => container.connect({host: '127.0.0.1', port, reconnect: false});

const cases = {
    // Attach a durable subscriber at once, so that the AMQP header, open,
    // begin and attach go out together (rhea skips SASL without a user name); the attach
    // waits for the store, which must not lose the connection. ARG rounds, each on a new
    // connection with its own container id; each must get what is then published.
    async 'durable-pipelined'() {
        const rounds = Number(arg);
        for (let n = 0; n < rounds; n++) {
            const connection = connect(rhea.create_container({id: `pipelined-${n}`}));
            const receiver = connection.open_receiver({
                name: 'subscription', source: {address: `topic://pipelined.${n}`, durable: 2, expiry_policy: 'never'}});
            await opened(receiver, connection);
            const got = bodiesUntil(receiver, `round ${n}`, connection);
            await send(connection, `topic://pipelined.${n}`, [`round ${n}`]);
            say('round', {n, bodies: await got});
            await close(connection);
        }
    },

    // One container, two connections (rhea and proton use the container's
    // id for each); a durable subscription in use on one is refused to the other.
    async 'one-container'() {
        const container = rhea.create_container({id: 'one-container'});
        const first = connect(container);
        const second = connect(container);
        await Promise.all([next(first, 'connection_open'), next(second, 'connection_open')]);
        const receiver = second.open_receiver('shared-by-two');
        await opened(receiver, second);
        const got = bodiesUntil(receiver, 'across', second);
        await send(first, 'shared-by-two', ['across']);
        say('both-open', {container_ids: [first.options.container_id, second.options.container_id],
                          bodies: await got});

        const durable = (connection) => connection.open_receiver({
            name: 'held', source: {address: 'topic://held.topic', durable: 2, expiry_policy: 'never'}});
        const holder = durable(first);
        await opened(holder, first);
        const condition = await refusal(durable(second), second);
        say('refused', {condition, second_still_open: second.is_open()});
        holder.detach();  // detach keeps the subscription; now the second may take it over
        await next(holder, 'receiver_close', first);
        const taker = durable(second);
        await opened(taker, second);
        const taken = bodiesUntil(taker, 'after', second);
        await send(first, 'topic://held.topic', ['after']);
        say('taken-over', {bodies: await taken});
        await Promise.all([close(first), close(second)]);
    },

    // Rhea's durable-subscription example subscribes to
    // topic://PRICE.STOCK.NYSE.* (ActiveMQ-style wildcards); a '#' subscriber besides. The
    // last message, to the root PRICE, reaches both in either syntax (a publication to a
    // node reaches everything below it).
    async 'wildcards'() {
        const connection = rhea.create_container({id: 'my-client'}).connect({host: '127.0.0.1', port, reconnect: false});
        const star = connection.open_receiver({
            name: 'my-subscription', source: {address: 'topic://PRICE.STOCK.NYSE.*', durable: 2, expiry_policy: 'never'}});
        const hash = connection.open_receiver('topic://PRICE.STOCK.#');
        await Promise.all([opened(star, connection), opened(hash, connection)]);
        const middle = connection.open_receiver('topic://PRICE.#.IBM');
        const middleOutcome = await opened(middle, connection).then(() => 'opened', (error) => error.condition);
        const gotStar = bodiesUntil(star, 'end', connection);
        const gotHash = bodiesUntil(hash, 'end', connection);
        for (const [address, body] of [['PRICE.STOCK.NYSE.RHT', 'RHT'], ['PRICE.BOND.X', 'BOND'],
                                       ['PRICE.STOCK.NASDAQ.MSFT', 'MSFT'], ['PRICE.STOCK.NYSE.IBM', 'IBM'],
                                       ['PRICE.STOCK.NYSE.*', 'literal-star'], ['PRICE', 'end']]) {
            await send(connection, `topic://${address}`, [body]);
        }
        say('received', {star: await gotStar, hash: await gotHash, middle: middleOutcome});
        await close(connection);
    },
};

cases[caseName]().then(() => process.exit(0), (error) => {
    say('error', {message: String(error && error.message || error)});
    process.exit(1);
});
