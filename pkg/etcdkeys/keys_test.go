package etcdkeys

import "testing"

func TestLayout(t *testing.T) {
	for got, want := range map[string]string{
		LeaseKey(DefaultPrefix, "ns", "report"):        "/fencer/leases/ns/report",
		LeasesPrefix("/p"):                             "/p/leases/",
		IDRangeNextKey("/p", "ns", "ids"):              "/p/idranges/ns/ids/next",
		SlotKey("/p", "ns", "ids", 7):                  "/p/idranges/ns/ids/slots/7",
		IDRangeConsumedKey("/p", "ns", "ids", 1000):    "/p/idranges/ns/ids/consumed/1000",
		LeaderKey("/p"):                                "/p/controller/leader",
		LeaseKey(OrDefault(""), "ns", "report"):        "/fencer/leases/ns/report",
		LeaseKey(OrDefault("/custom"), "ns", "report"): "/custom/leases/ns/report",
	} {
		if got != want {
			t.Errorf("got %s, want %s", got, want)
		}
	}
	ns, name, n, ok := ParseSlotKey("/p", SlotKey("/p", "ns", "ids", 7))
	if !ok || ns != "ns" || name != "ids" || n != 7 {
		t.Errorf("ParseSlotKey round trip: %s %s %d %v", ns, name, n, ok)
	}
}
