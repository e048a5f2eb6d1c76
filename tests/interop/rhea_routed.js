// rhea at the far end of a router network, driven by tests/interop/test_routing.py.
// Usage:
//   node rhea_routed.js receive PORT QUEUE COUNT   prints each message as one JSON line
//   node rhea_routed.js serve PORT QUEUE COUNT     answers COUNT requests to each reply-to
// It prints {"event": "ready"} once its receiver is attached, and {"event": "done"} at the end.
'use strict';

const rhea = require('rhea');

const [mode, port, queue, count] = [process.argv[2], Number(process.argv[3]), process.argv[4],
    Number(process.argv[5])];
const say = (event, fields) => console.log(JSON.stringify({event, ...fields}));
const container = rhea.create_container({id: `rhea-${mode}`});
const connection = container.connect({host: '127.0.0.1', port, reconnect: false});
const receiver = connection.open_receiver({source: queue, credit_window: 10});
const replies = mode === 'serve' ? connection.open_sender({target: {}}) : null;  // anonymous
let seen = 0;
let answered = 0;  // replies the router accepted: the connection closes only after the last one
const finish = () => { receiver.close(); connection.close(); };

receiver.on('receiver_open', () => say('ready', {}));
receiver.on('message', (context) => {
    const message = context.message;
    if (mode === 'receive') {
        say('message', {body: message.body, subject: message.subject, message_id: message.message_id,
                        correlation_id: message.correlation_id, content_type: message.content_type,
                        durable: message.durable, priority: message.priority,
                        properties: message.application_properties,
                        annotations: message.message_annotations});
    } else {
        replies.send({to: message.reply_to, correlation_id: message.message_id,
                      body: String(message.body).toUpperCase()});
        say('served', {reply_to: message.reply_to});
    }
    // A server closing right after sending would drop a reply still waiting for credit or
    // for the router's disposition, so the last reply's acceptance ends the conversation.
    if (++seen === count && mode === 'receive') finish();
});
if (replies) {
    replies.on('accepted', () => { if (++answered === count) finish(); });
    for (const outcome of ['rejected', 'released', 'modified']) {
        replies.on(outcome, (context) => {
            say('error', {where: outcome, error: JSON.stringify(context.delivery.remote_state || {})});
            process.exit(1);
        });
    }
}
connection.on('connection_close', () => say('done', {}));
for (const name of ['receiver_error', 'sender_error', 'connection_error', 'error']) {
    connection.on(name, (context) => {
        say('error', {where: name, error: JSON.stringify((context.receiver || context.sender ||
                                                           context.connection || {}).error || context)});
        process.exit(1);
    });
}
