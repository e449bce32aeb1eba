"""ctypes binding to IOReport (private, but stable since macOS 11 and used rootless by
macmon and SocPowerBuddy): subscribe to the "Energy Model" group, take samples, and
turn the delta of two samples into plain ``{"channel", "unit", "value"}`` records.

Only imported on macOS; everything it returns is tested elsewhere on recorded records.
Ownership follows CoreFoundation's rule: what a ``Create``/``Copy`` call returns is
released here, what a ``Get`` call returns is borrowed.
"""

from __future__ import annotations

import ctypes
import weakref
from ctypes import (
    POINTER,
    byref,
    c_bool,
    c_char_p,
    c_int32,
    c_int64,
    c_long,
    c_uint32,
    c_uint64,
    c_void_p,
)

from labkit.errors import LabkitError

IOREPORT_PATH = "/usr/lib/libIOReport.dylib"
COREFOUNDATION_PATH = "/System/Library/Frameworks/CoreFoundation.framework/CoreFoundation"
GROUP = "Energy Model"
_UTF8 = 0x08000100  # kCFStringEncodingUTF8


def _fn(lib, name, restype, *argtypes):
    f = getattr(lib, name)
    f.restype, f.argtypes = restype, list(argtypes)
    return f


class _Libs:
    """The handful of CoreFoundation and IOReport functions, with their C signatures."""

    def __init__(self):
        try:
            cf = ctypes.CDLL(COREFOUNDATION_PATH)
            io = ctypes.CDLL(IOREPORT_PATH)
        except OSError as exc:
            raise LabkitError(f"cannot load IOReport ({IOREPORT_PATH}): {exc}") from exc
        v = c_void_p
        self.CFRelease = _fn(cf, "CFRelease", None, v)
        self.CFStringCreateWithCString = _fn(
            cf, "CFStringCreateWithCString", v, v, c_char_p, c_uint32
        )
        self.CFStringGetCString = _fn(
            cf, "CFStringGetCString", c_bool, v, c_char_p, c_long, c_uint32
        )
        self.CFDictionaryGetCount = _fn(cf, "CFDictionaryGetCount", c_long, v)
        self.CFDictionaryGetValue = _fn(cf, "CFDictionaryGetValue", v, v, v)
        self.CFDictionaryCreateMutableCopy = _fn(
            cf, "CFDictionaryCreateMutableCopy", v, v, c_long, v
        )
        self.CFArrayGetCount = _fn(cf, "CFArrayGetCount", c_long, v)
        self.CFArrayGetValueAtIndex = _fn(cf, "CFArrayGetValueAtIndex", v, v, c_long)
        self.IOReportCopyChannelsInGroup = _fn(
            io, "IOReportCopyChannelsInGroup", v, v, v, c_uint64, c_uint64, c_uint64
        )
        self.IOReportCreateSubscription = _fn(
            io, "IOReportCreateSubscription", v, v, v, POINTER(c_void_p), c_uint64, v
        )
        self.IOReportCreateSamples = _fn(io, "IOReportCreateSamples", v, v, v, v)
        self.IOReportCreateSamplesDelta = _fn(io, "IOReportCreateSamplesDelta", v, v, v, v)
        self.IOReportChannelGetGroup = _fn(io, "IOReportChannelGetGroup", v, v)
        self.IOReportChannelGetChannelName = _fn(io, "IOReportChannelGetChannelName", v, v)
        self.IOReportChannelGetUnitLabel = _fn(io, "IOReportChannelGetUnitLabel", v, v)
        self.IOReportSimpleGetIntegerValue = _fn(
            io, "IOReportSimpleGetIntegerValue", c_int64, v, c_int32
        )

    def cfstr(self, text: str) -> int:
        return self.CFStringCreateWithCString(None, text.encode(), _UTF8)

    def pystr(self, ref: int | None) -> str:
        if not ref:
            return ""
        buf = ctypes.create_string_buffer(256)
        if not self.CFStringGetCString(ref, buf, len(buf), _UTF8):
            return ""
        return buf.value.decode("utf-8", "replace")


class Sample:
    """One IOReport sample (a CFDictionary we own); released when garbage-collected."""

    def __init__(self, libs: _Libs, ref: int):
        self.ref = ref
        weakref.finalize(self, libs.CFRelease, ref)


class EnergyModelSubscription:
    """A subscription to the Energy Model channels; ``sample()`` twice, then ``delta_records``."""

    def __init__(self):
        self._libs = libs = _Libs()
        group = libs.cfstr(GROUP)
        try:
            channels = libs.IOReportCopyChannelsInGroup(group, None, 0, 0, 0)
        finally:
            libs.CFRelease(group)
        if not channels:
            raise LabkitError(
                "IOReport has no 'Energy Model' channels (Intel Mac or a virtual machine?)"
            )
        # IOReportCreateSubscription wants a mutable dictionary (as macmon does).
        self._channels = libs.CFDictionaryCreateMutableCopy(
            None, libs.CFDictionaryGetCount(channels), channels
        )
        libs.CFRelease(channels)
        self._subscribed = c_void_p()
        self._sub = libs.IOReportCreateSubscription(
            None, self._channels, byref(self._subscribed), 0, None
        )
        if not self._sub:
            libs.CFRelease(self._channels)
            raise LabkitError("IOReport refused the Energy Model subscription")

    def sample(self) -> Sample:
        ref = self._libs.IOReportCreateSamples(self._sub, self._subscribed, None)
        if not ref:
            raise LabkitError("IOReportCreateSamples returned nothing")
        return Sample(self._libs, ref)

    def delta_records(self, start: Sample, end: Sample) -> list[dict]:
        """Energy Model channels of ``end - start`` as ``{"channel", "unit", "value"}``."""
        libs = self._libs
        delta = libs.IOReportCreateSamplesDelta(start.ref, end.ref, None)
        if not delta:
            raise LabkitError("IOReportCreateSamplesDelta returned nothing")
        key = libs.cfstr("IOReportChannels")
        try:
            items = libs.CFDictionaryGetValue(delta, key)
            records = []
            for i in range(libs.CFArrayGetCount(items) if items else 0):
                item = libs.CFArrayGetValueAtIndex(items, i)
                if libs.pystr(libs.IOReportChannelGetGroup(item)) != GROUP:
                    continue
                records.append(
                    {
                        "channel": libs.pystr(libs.IOReportChannelGetChannelName(item)),
                        "unit": libs.pystr(libs.IOReportChannelGetUnitLabel(item)).strip(),
                        "value": int(libs.IOReportSimpleGetIntegerValue(item, 0)),
                    }
                )
            return records
        finally:
            libs.CFRelease(key)
            libs.CFRelease(delta)

    def close(self) -> None:
        # The subscription is a CF object too (macmon releases it the same way).
        for attr in ("_sub", "_channels"):
            ref = getattr(self, attr, None)
            if ref:
                self._libs.CFRelease(ref)
                setattr(self, attr, None)
        if self._subscribed.value:
            self._libs.CFRelease(self._subscribed)
            self._subscribed = c_void_p()
