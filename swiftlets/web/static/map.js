// The network map: an inline SVG drawn from each "map" event of /events (Server-Sent
// Events: the whole map when the stream opens and at each change; the browser reconnects
// by itself after a break, and gets the whole map again).
// Routers sit on a circle in name order, the local router at the top; every element
// carries data-router / data-edge and data-state, and its class names the state (colours
// in the page's style). A link is labelled with its messages/s (both ways) and a router with
// the messages in its queues, where the router measured them (map.rates, map.backlogs).
(function () {
  "use strict";
  const SVG = "http://www.w3.org/2000/svg";
  const svg = document.getElementById("map");
  const status = document.getElementById("status");
  const links = document.querySelector("#links tbody");
  const routers = document.querySelector("#routers tbody");

  function element(name, attributes, parent) {
    const node = document.createElementNS(SVG, name);
    for (const [key, value] of Object.entries(attributes)) node.setAttribute(key, value);
    parent.appendChild(node);
    return node;
  }

  function since(seconds) {
    return new Date(seconds * 1000).toLocaleString();
  }

  function positions(map) {
    const names = map.routers.map((r) => r.name);
    const start = Math.max(0, names.indexOf(map.local));
    const width = svg.viewBox.baseVal.width, height = svg.viewBox.baseVal.height;
    const radius = Math.min(width, height) / 2 - 60;
    const result = {};
    names.forEach((name, index) => {
      const angle = -Math.PI / 2 + (2 * Math.PI * (index - start)) / names.length;
      result[name] = names.length === 1 ? [width / 2, height / 2]
        : [width / 2 + radius * Math.cos(angle), height / 2 + radius * Math.sin(angle)];
    });
    return result;
  }

  function draw(map) {
    const at = positions(map);
    svg.replaceChildren();
    links.replaceChildren();
    routers.replaceChildren();
    for (const edge of map.edges) {
      const [x1, y1] = at[edge.a], [x2, y2] = at[edge.b];
      const line = element("line", {x1, y1, x2, y2, class: "edge state-" + edge.state,
                                    "data-edge": edge.a + "|" + edge.b, "data-state": edge.state}, svg);
      element("title", {}, line).textContent = edge.a + " – " + edge.b + ": " + edge.state + " since " +
        since(edge.since) + (edge.error ? " (" + edge.error + ")" : "");
      const rate = (map.rates || {})[edge.a + "|" + edge.b];
      if (rate !== undefined) {
        element("text", {x: (x1 + x2) / 2, y: (y1 + y2) / 2 - 6, class: "rate state-" + edge.state,
                         "data-rate": edge.a + "|" + edge.b}, svg).textContent = rate.toFixed(1) + " msg/s";
      }
      const row = links.insertRow();
      row.dataset.edge = edge.a + "|" + edge.b;
      row.dataset.state = edge.state;
      row.className = "state-" + edge.state;
      for (const text of [edge.a + " – " + edge.b + (edge.local ? "" : " (from routes)"), edge.state,
                          since(edge.since), edge.error]) {
        row.insertCell().textContent = text;
      }
      // the last hour's sparkline: an SVG of numbers drawn by the router itself
      row.insertCell().innerHTML = (map["rate-history"] || {})[edge.a + "|" + edge.b] || "";
    }
    for (const router of map.routers) {
      const [x, y] = at[router.name];
      const link = element("a", {href: "/routers/" + encodeURIComponent(router.name)}, svg);
      const circle = element("circle", {cx: x, cy: y, r: 18, class: "router state-" + router.state,
                                        "data-router": router.name, "data-state": router.state}, link);
      element("title", {}, circle).textContent = router.name + ": " + router.state +
        (router.hops ? " (" + router.hops + " hops)" : "");
      element("text", {x, y: y + 36}, link).textContent = router.name;
      const backlog = (map.backlogs || {})[router.name];
      if (backlog !== undefined) {
        element("text", {x, y: y + 54, class: "backlog", "data-backlog": router.name}, link).textContent =
          backlog + " msgs";
      }
      const row = routers.insertRow();
      row.dataset.router = router.name;
      for (const text of [router.name, router.state, backlog === undefined ? "" : String(backlog)]) {
        row.insertCell().textContent = text;
      }
      row.insertCell().innerHTML = (map["backlog-history"] || {})[router.name] || "";
    }
    status.textContent = map.routers.length + " routers, " + map.edges.length + " links, as of " +
      new Date().toLocaleTimeString();
  }

  const events = new EventSource("/events");
  events.addEventListener("map", (event) => draw(JSON.parse(event.data)));
  events.onerror = () => { status.textContent = "connection to the router lost; retrying…"; };
})();
