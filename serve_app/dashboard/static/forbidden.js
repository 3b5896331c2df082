// A page this viewer may not open: only the header works (organization switch, sign out).
"use strict";

GW.start(async () => {});
