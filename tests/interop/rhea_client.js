// rhea (the Node.js AMQP 1.0 library) against a live router, driven by tests/interop/test_rhea.py.
// Usage: node rhea_client.js PORT. Each step prints one JSON line; the Python side answers
// some of them (it publishes once we print "subscribed", it replies to our request).
'use strict';

const rhea = require('rhea');

const port = Number(process.argv[2]);
const container = rhea.create_container({id: 'rhea-interop'});
const say = (event, fields) => console.log(JSON.stringify({event, ...fields}));

function once(emitter, name) {
    return new Promise((resolve, reject) => {
        emitter.once(name, resolve);
        emitter.once('receiver_error', (context) => reject(new Error(JSON.stringify(context.receiver.error))));
        emitter.once('sender_error', (context) => reject(new Error(JSON.stringify(context.sender.error))));
    });
}

// A receiver taking `count` messages: {opened, messages}, two promises.
function receive(connection, source, count) {
    const receiver = connection.open_receiver({source, credit_window: count});
    const collected = [];
    const opened = once(receiver, 'receiver_open');
    const messages = new Promise((resolve, reject) => {
        receiver.on('message', (context) => {
            collected.push(context.message);
            if (collected.length === count) {
                receiver.close();
                resolve(collected);
            }
        });
        receiver.on('receiver_error', (context) => reject(new Error(JSON.stringify(context.receiver.error))));
    });
    return {opened, messages};
}

async function main() {
    const connection = container.connect({host: '127.0.0.1', port, reconnect: false});
    await once(connection, 'connection_open');

    // 1. three sends to a queue: the outcome of each, in the order sent, once all are settled
    const sender = connection.open_sender('from-rhea');
    await once(sender, 'sendable');
    const deliveries = [];
    const outcomes = [null, null, null];
    const allSettled = new Promise((resolve) => {
        for (const outcome of ['accepted', 'released', 'rejected', 'modified']) {
            sender.on(outcome, (context) => {
                const n = deliveries.indexOf(context.delivery);
                if (n < 0) outcomes.push(`${outcome} (unknown delivery)`); else outcomes[n] = outcome;
                if (!outcomes.includes(null)) resolve();
            });
        }
    });
    for (let n = 0; n < 3; n++) {
        deliveries.push(sender.send({body: `rhea ${n}`, application_properties: {n}, durable: true}));
    }
    await allSettled;
    say('sent', {outcomes});

    // 2. what our Python client put on a queue
    const [fromPython] = await receive(connection, 'to-rhea', 1).messages;
    say('received', {body: fromPython.body, properties: fromPython.application_properties,
                     annotations: fromPython.message_annotations});

    // 3. a JMS selector through the Qpid JMS filter
    const selector = rhea.filter.selector("colour = 'red'");
    const picked = await receive(connection, {address: 'picked', filter: selector}, 2).messages;
    say('selected', {bodies: picked.map((message) => message.body)});

    // 4. a topic by capability: the Python side publishes once we are subscribed
    const news = receive(connection, {address: 'news', capabilities: ['topic']}, 1);
    await news.opened;  // the router subscribes before it answers the attach
    say('subscribed', {});
    const [story] = await news.messages;
    say('published', {body: story.body});

    // 5. request/reply over a dynamic (temporary) queue: the Python side serves 'service'
    const replies = connection.open_receiver({source: {dynamic: true}});
    const opened = await once(replies, 'receiver_open');
    const replyTo = opened.receiver.source.address;
    const reply = new Promise((resolve) => replies.once('message', (context) => resolve(context.message)));
    const requests = connection.open_sender('service');
    await once(requests, 'sendable');
    requests.send({body: 'ping', reply_to: replyTo, message_id: 'req-1'});
    const answer = await reply;
    say('replied', {body: answer.body, correlation_id: answer.correlation_id, reply_to: replyTo});

    connection.close();
    await once(connection, 'connection_close');
    say('closed', {});
}

main().catch((error) => {
    say('error', {message: String(error && error.message || error)});
    process.exit(1);
});
