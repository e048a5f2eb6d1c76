"""The Martinet kernel: boot, config, plugins, event bus, pools and the management model.

The kernel knows nothing about messaging. Swiftlets import what they need from here::

    from kernel import SwiftletSpec, SwiftletContext, config_class, prop, hookimpl

Layers, bottom up: :mod:`kernel.schema` (declaring config), :mod:`kernel.xmlconfig`
(reading and writing it), :mod:`kernel.bus`, :mod:`kernel.pools`, :mod:`kernel.mgmt`
(the live tree), :mod:`kernel.plugins` (finding swiftlets), :mod:`kernel.config` (the
router file), :mod:`kernel.router` (the lifecycle) and :mod:`kernel.cli`.
"""

from .bus import (
    EntityAdded as EntityAdded,
    EntityRemoved as EntityRemoved,
    Event as Event,
    EventBus as EventBus,
    Overflow as Overflow,
    PropertyChanged as PropertyChanged,
    RouterStarted as RouterStarted,
    RouterStopping as RouterStopping,
    SubscriberOverflow as SubscriberOverflow,
    Subscription as Subscription,
    SwiftletStarted as SwiftletStarted,
    SwiftletStopped as SwiftletStopped,
    event_types as event_types,
)
from .config import (
    ConfigError as ConfigError,
    ConfigErrors as ConfigErrors,
    RouterConfig as RouterConfig,
    load_config as load_config,
)
from .mgmt import (
    Change as Change,
    Entity as Entity,
    EntityList as EntityList,
    ManagementError as ManagementError,
    Tree as Tree,
    Usage as Usage,
    UsageList as UsageList,
    Veto as Veto,
)
from .plugins import (
    PluginError as PluginError,
    SwiftletSpec as SwiftletSpec,
    hookimpl as hookimpl,
    load_swiftlet_specs as load_swiftlet_specs,
)
from .pools import Pool as Pool, PoolFull as PoolFull, PoolSpec as PoolSpec
from .router import Router as Router, SwiftletContext as SwiftletContext, SwiftletFailed as SwiftletFailed
from .schema import config_class as config_class, entity as entity, entity_list as entity_list, prop as prop
